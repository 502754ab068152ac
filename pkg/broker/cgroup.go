package broker

import (
	"fmt"
	"regexp"
	"strings"
)

// PodIdentity is who a process is to kubelet: the pod's UID and the
// container's runtime id, from the process's cgroup.
type PodIdentity struct {
	PodUID      string
	ContainerID string
}

var (
	// cgroupfs driver: .../kubepods/<qos>/pod<uid>/<container id>
	cgroupfsPod = regexp.MustCompile(`^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`)
	// systemd driver: kubepods-<qos>-pod<uid with _>.slice
	systemdPod = regexp.MustCompile(`^kubepods(?:-[a-z]+)?-pod([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})\.slice$`)
	// container: a runtime id, bare (cgroupfs) or as a systemd scope.
	containerScope = regexp.MustCompile(`^(?:cri-containerd|crio|docker|cri-o)-([0-9a-f]{12,64})\.scope$`)
	containerBare  = regexp.MustCompile(`^([0-9a-f]{12,64})$`)
)

// ParsePodCgroup finds the pod UID and container id in the contents of
// /proc/<pid>/cgroup, for the kubelet's cgroupfs and systemd drivers and
// cgroup v1 and v2. Every hierarchy that names a pod must name the same
// one. A process outside any pod is an error.
func ParsePodCgroup(content string) (PodIdentity, error) {
	var id PodIdentity
	found := false
	for _, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return PodIdentity{}, fmt.Errorf("cgroup line %q: not hierarchy:controllers:path", line)
		}
		got, ok := podFromPath(parts[2])
		if !ok {
			continue
		}
		if found && (got.PodUID != id.PodUID || (got.ContainerID != "" && id.ContainerID != "" && got.ContainerID != id.ContainerID)) {
			return PodIdentity{}, fmt.Errorf("cgroup hierarchies disagree: pod %s container %s and pod %s container %s",
				id.PodUID, id.ContainerID, got.PodUID, got.ContainerID)
		}
		if !found || id.ContainerID == "" {
			id = got
		}
		found = true
	}
	if !found {
		return PodIdentity{}, fmt.Errorf("the process is in no kubelet pod cgroup")
	}
	return id, nil
}

func podFromPath(path string) (PodIdentity, bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i, s := range segs {
		var uid string
		if m := cgroupfsPod.FindStringSubmatch(s); m != nil {
			uid = m[1]
		} else if m := systemdPod.FindStringSubmatch(s); m != nil {
			uid = strings.ReplaceAll(m[1], "_", "-")
		} else {
			continue
		}
		id := PodIdentity{PodUID: uid}
		if i+1 < len(segs) {
			next := segs[i+1]
			if m := containerScope.FindStringSubmatch(next); m != nil {
				id.ContainerID = m[1]
			} else if m := containerBare.FindStringSubmatch(next); m != nil {
				id.ContainerID = m[1]
			}
		}
		return id, true
	}
	return PodIdentity{}, false
}
