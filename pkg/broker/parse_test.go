package broker

import (
	"errors"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/wire"
)

func TestParsePodCgroup(t *testing.T) {
	const uid = "0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"
	const cid = "4b825dc642cb6eb9a060e54bf8d69288fbee4904abcdef0123456789abcdef01"
	for _, c := range []struct {
		name, content string
		want          PodIdentity
	}{
		{"cgroupfs v1", "12:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n11:memory:/kubepods/besteffort/pod" + uid + "/" + cid + "\n1:name=systemd:/system.slice/containerd.service\n", PodIdentity{uid, cid}},
		{"cgroupfs v1 guaranteed", "4:cpu,cpuacct:/kubepods/pod" + uid + "/" + cid + "\n", PodIdentity{uid, cid}},
		{"systemd v1", "9:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n", PodIdentity{uid, cid}},
		{"systemd v2", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/crio-" + cid + ".scope\n", PodIdentity{uid, cid}},
		{"systemd v2 guaranteed", "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/docker-" + cid + ".scope\n", PodIdentity{uid, cid}},
		{"cgroupfs v2", "0::/kubepods/burstable/pod" + uid + "/" + cid + "\n", PodIdentity{uid, cid}},
		{"pod cgroup only", "0::/kubepods/burstable/pod" + uid + "\n", PodIdentity{uid, ""}},
		// The daemon's container has a cgroup namespace of its own (cgroup v2
		// runtimes' default; Kubernetes has no hostCgroupns): another pod's
		// path is relative to the daemon's cgroup (cgroup_namespaces(7)).
		{"systemd v2 from the DaemonSet's cgroup namespace", "0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n", PodIdentity{uid, cid}},
		{"cgroupfs v2 from the DaemonSet's cgroup namespace", "0::/../../../besteffort/pod" + uid + "/" + cid + "\n", PodIdentity{uid, cid}},
		{"kind nested", "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n", PodIdentity{}},
	} {
		got, err := ParsePodCgroup(c.content)
		if c.want == (PodIdentity{}) {
			if err == nil {
				t.Errorf("%s: found %+v in a layout it does not know", c.name, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	for _, bad := range []string{
		"",
		"0::/user.slice/user-0.slice/session-1.scope\n",
		"garbage",
		"12:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n11:memory:/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/" + cid + "\n",
	} {
		if got, err := ParsePodCgroup(bad); err == nil {
			t.Errorf("%q: accepted as %+v", bad, got)
		}
	}
}

// FuzzRequestChecks: a message the decoder lets through never makes the
// broker's checks panic.
func FuzzRequestChecks(f *testing.F) {
	f.Add([]byte(`{"type":"hello","version":1,"client":"xdpqperf"}`), wire.TypeHello)
	f.Add([]byte(`{"type":"request","frame_size":2048,"headroom":0,"rings":{"fill":2048,"completion":64,"rx":2048,"tx":0},"queues":[0,1]}`), wire.TypeRequest)
	f.Add([]byte(`{"type":"ready"}`), wire.TypeReady)
	f.Add([]byte(`{"type":"request","frame_size":4096,"rings":{"fill":4096,"completion":4096,"rx":4096,"tx":0},"queues":[0],"multi_buffer":true}`), wire.TypeRequest)
	f.Add([]byte(`{"type":"resume","queues":[0,1]}`), wire.TypeResume)
	f.Add([]byte(`{"type":"welcome","version":1,"allocation":"a","netdev":"eth1","queues":[8,9],"busy_poll":{"timeout_us":50,"budget":64}}`), wire.TypeWelcome)
	f.Fuzz(func(t *testing.T, b []byte, want string) {
		m, err := wire.ParseMessage(b, want)
		if err != nil {
			var pe *wire.ProtocolError
			if !errors.As(err, &pe) || pe.Code != wire.CodeBadMessage {
				t.Fatalf("error %v is not a bad-message refusal", err)
			}
			return
		}
		if m.Type != want {
			t.Fatalf("type %q, want %q", m.Type, want)
		}
		switch m.Type { // must not panic
		case wire.TypeRequest:
			checkRequest(m, []uint32{0, 1}, wire.DefaultLimits)
		case wire.TypeResume:
			checkResume(m, len(m.Queues), []LeaseSocket{{Queue: 0, Inode: 1}, {Queue: 1, Inode: 2}})
		case wire.TypeWelcome:
			if m.BusyPoll != nil {
				_ = m.BusyPoll.Validate() // the fuzz asks only that it does not panic
			}
		}
	})
}

func FuzzParsePodCgroup(f *testing.F) {
	f.Add("12:pids:/kubepods/besteffort/pod0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f/abcdef012345\n")
	f.Add("0::/kubepods.slice/kubepods-pod0c1d2e3f_4a5b_6c7d_8e9f_0a1b2c3d4e5f.slice/cri-containerd-abcdef012345.scope\n")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParsePodCgroup(s)
		if err == nil && len(id.PodUID) != 36 {
			t.Fatalf("pod uid %q", id.PodUID)
		}
	})
}

func TestParseDPDKCommand(t *testing.T) {
	for _, c := range []struct {
		in   string
		name string
		args int
		ok   bool
	}{
		{"/connect,node-1", "/connect", 1, true},
		{"/version", "/version", 0, true},
		{"/xsk_map_fd,eth0", "/xsk_map_fd", 1, true},
		{"/config_busy_poll,20,64", "/config_busy_poll", 2, true},
		{"/fin\x00", "/fin", 0, true},
		{"connect", "", 0, false},
		{"", "", 0, false},
		{"/x\x01", "", 0, false},
		{"/" + strings.Repeat("a", 200), "", 0, false},
	} {
		cmd, err := parseDPDKCommand([]byte(c.in))
		if (err == nil) != c.ok || (c.ok && (cmd.name != c.name || len(cmd.args) != c.args)) {
			t.Errorf("%q: %+v, %v", c.in, cmd, err)
		}
	}
	if _, _, err := busyPollArgs([]string{"20", "64"}); err != nil {
		t.Error(err)
	}
	for _, bad := range [][]string{{"0", "64"}, {"20"}, {"x", "1"}, {"20", "70000"}} {
		if _, _, err := busyPollArgs(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func FuzzParseDPDKCommand(f *testing.F) {
	for _, s := range []string{"/connect,host", "/version", "/xsk_map_fd,eth0", "/config_busy_poll,20,64", "/fin"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cmd, err := parseDPDKCommand(b)
		if err != nil {
			return
		}
		if !strings.HasPrefix(cmd.name, "/") || len(cmd.name)+len(strings.Join(cmd.args, ",")) > dpdkMaxCommand {
			t.Fatalf("%q parsed as %+v", b, cmd)
		}
		if cmd.name == dpdkBusyPoll {
			busyPollArgs(cmd.args)
		}
	})
}

// TestMultiBufferChecks: a request's multi_buffer reaches the bind
// config; a resume carrying it is refused (a resumed socket keeps how it
// was bound).
func TestMultiBufferChecks(t *testing.T) {
	m, err := wire.ParseMessage([]byte(`{"type":"request","frame_size":4096,"rings":{"fill":4096,"completion":4096,"rx":4096,"tx":0},"queues":[0],"multi_buffer":true}`), wire.TypeRequest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := checkRequest(m, []uint32{0, 1}, wire.DefaultLimits)
	if err != nil || !cfg.MultiBuffer {
		t.Fatalf("request: %+v, %v; want multi-buffer", cfg, err)
	}
	m, err = wire.ParseMessage([]byte(`{"type":"resume","queues":[0],"multi_buffer":true}`), wire.TypeResume)
	if err != nil {
		t.Fatal(err)
	}
	var pe *wire.ProtocolError
	if err := checkResume(m, 1, []LeaseSocket{{Queue: 0, Inode: 1}}); !errors.As(err, &pe) || pe.Code != wire.CodeBadRequest {
		t.Fatalf("resume with multi_buffer: %v, want bad-request", err)
	}
}
