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
// The control plane listens on 127.0.0.1 only, with a certificate
// authority of its own, static tokens (an admin in system:masters, the
// controllers, the node) and Node,RBAC authorization. The node runs
// containerd 2 (with CDI, which DRA drivers need, and NRI), built from
// its Go module by kubebin in a module of its own (kubebin/containerd),
// with Debian's runc; it needs root, runc and containernetworking-plugins; its
// pods are on a bridge with host-local addresses (DefaultPodCIDR) and no
// route out. One node runs at a time on a machine (a lock file says so);
// tests that run one should hold the kernel lock of the project's
// kernel tests (flock -o /tmp/xdpq-kernel.lock go test ...).
//
// Teardown (Stop, from t.Cleanup, and on SIGINT or SIGTERM) leaves the
// machine as it was: processes, pods' containers and cgroups, mounts,
// network namespaces, the bridge, containerd's state, the CNI files,
// the kubelet's files and the sysctls the kubelet changes. StartNode
// first removes what a run killed before its teardown left.
package cluster
