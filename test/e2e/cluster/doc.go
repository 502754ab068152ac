// Package cluster runs a real single-node Kubernetes cluster for xdpq's
// end-to-end tests: etcd and kube-apiserver (StartControlPlane), then
// containerd, kube-controller-manager, kube-scheduler and a kubelet
// (StartNode), all v1.37.2 binaries built by package kubebin.
//
// A test gets both and their teardown from t.Cleanup:
//
//	cp := cluster.StartControlPlaneForTest(t, cluster.Options{})
//	n := cluster.StartNodeForTest(t, cp, cluster.NodeOptions{})
//	n.ImportImage(ctx, archive) // a docker-archive; pods use imagePullPolicy Never
//	cp.CreateNamespace(ctx, "ns", nil)
//	cp.Client.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{})
//	cp.WaitPod(ctx, "ns", pod.Name, cluster.PodRunning)
//	cp.Kubectl(ctx, "logs", "-n", "ns", pod.Name)
//
// AddNIC gives the node a "NIC": a veth with queues in the host's
// network namespace, its peer in a traffic namespace of its own.
//
// A second node joins the way kind runs one, without Docker: with
// Options.Network the control plane makes the cluster's network (the
// bridge NetworkBridge, the host at 10.250.0.1, where the apiserver
// listens), and StartNode with NodeOptions.Isolated runs the node's
// containerd and kubelet (through nsenter) in a network namespace with
// eth0 on that bridge and a mount namespace with a sysfs of its own
// links, a bpffs of its own and private copies of the host directories
// programs find at fixed paths (/var/lib/kubelet, /run/xdpq, the CDI
// directories, /run/netns, /run/containerd, ...); its pods' cgroups are
// under a root of its own. The first node stays in the host's
// namespaces and runs the controllers; Node.Exec runs a command on a
// node.
//
// The control plane listens on 127.0.0.1 only (or its network's host
// address), with a certificate
// authority of its own, static tokens (an admin in system:masters, the
// controllers, the node) and Node,RBAC authorization. The node runs
// containerd 2 (with CDI, which DRA drivers need, and NRI), built from
// its Go module by kubebin in a module of its own (kubebin/containerd),
// with Debian's runc; it needs root, runc and containernetworking-plugins; its
// pods are on a bridge with host-local addresses (DefaultPodCIDR) and no
// route out. One node runs in a directory at a time, one first node on
// a machine (a lock file in the parent of Dir says so);
// tests that run one should hold the kernel lock of the project's
// kernel tests (flock -o /tmp/xdpq-kernel.lock go test ...).
//
// Teardown (Stop, from t.Cleanup, and on SIGINT or SIGTERM) leaves the
// machine as it was: processes, pods' containers and cgroups, mounts,
// network namespaces, the bridge, containerd's state, the CNI files,
// the kubelet's files and the sysctls the kubelet changes. StartNode
// first removes what a run killed before its teardown left.
package cluster
