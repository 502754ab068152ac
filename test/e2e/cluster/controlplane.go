package cluster

import (
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// startTimeout bounds the wait for a component to be ready.
const startTimeout = 2 * time.Minute

// Users of the static token file: name and groups.
const (
	adminUser = "xdpq-e2e-admin"
	// ServiceCIDR is the cluster's service address range.
	ServiceCIDR = "10.96.0.0/24"
)

// Options configure StartControlPlane.
type Options struct {
	// Binaries are the programs to run; nil builds (or finds in the
	// cache) those of the e2e module with kubebin.
	Binaries kubebin.Paths
	// NodeName is the name of the node the control plane gives a token
	// (Node.Token); "" is the host's name in lower case.
	NodeName string
	// Log receives a line per step; nil is io.Discard.
	Log io.Writer
	// Network makes the cluster's network (see Network) and has the
	// apiserver listen on the host's address in it rather than on
	// 127.0.0.1, so that isolated nodes (NodeOptions.Isolated) reach it.
	Network bool
}

// ControlPlane is etcd and kube-apiserver on 127.0.0.1 (the apiserver on
// the host's address in the cluster's network, with Options.Network), with token
// authentication, Node and RBAC authorization and NodeRestriction.
type ControlPlane struct {
	// Dir holds the control plane's data, certificates, kubeconfigs and
	// logs (<component>.log).
	Dir string
	// URL is the apiserver's address: https://127.0.0.1:<port>.
	URL string
	// Kubeconfig is the path of an admin kubeconfig (system:masters).
	Kubeconfig string
	// Config is the admin's client configuration.
	Config *rest.Config
	// Client is a clientset of Config.
	Client kubernetes.Interface
	// Binaries are the paths of the programs the cluster runs.
	Binaries kubebin.Paths
	// CAFile is the PEM file of the certificate authority that signs
	// the apiserver's serving certificate and the kubelet's.
	CAFile string
	// NodeName is the node whose credentials NodeKubeconfig holds.
	NodeName string
	// NodeKubeconfig is the path of a kubeconfig of
	// system:node:<NodeName> in system:nodes.
	NodeKubeconfig string
	// Network is the cluster's network (Options.Network), nil without.
	Network *Network

	ca       *ca
	tokens   map[string]string // user -> token
	saKey    string
	log      io.Writer
	mu       sync.Mutex // guards procs and stopped: Stop may run during a start (Ctrl-C)
	procs    []*process // in start order
	stopped  bool
	stopOnce sync.Once
	stopErr  error
	cancel   func() // the signal handler's
}

// StartControlPlane starts etcd and kube-apiserver with their state in
// dir, which it creates and Stop removes, and waits until the apiserver
// is ready. On error nothing it started is left running.
func StartControlPlane(ctx context.Context, dir string, opts Options) (cp *ControlPlane, err error) {
	t0 := time.Now()
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Binaries == nil {
		opts.Binaries, err = kubebin.Ensure(ctx, kubebin.Options{Progress: opts.Log},
			kubebin.Etcd, kubebin.KubeAPIServer, kubebin.Kubectl)
		if err != nil {
			return nil, err
		}
	}
	if opts.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("control plane: node name: %w", err)
		}
		opts.NodeName = strings.ToLower(h)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	cp = &ControlPlane{
		Dir:      dir,
		Binaries: opts.Binaries,
		NodeName: opts.NodeName,
		log:      opts.Log,
		tokens:   map[string]string{},
	}
	cp.cancel = onSignal(func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
	})
	started := cp
	defer func() {
		if err != nil {
			err = errors.Join(err, started.Stop())
		}
	}()
	if opts.Network {
		if cp.Network, err = startNetwork(ctx, cp.log); err != nil {
			return nil, err
		}
	}
	if err := cp.writeCredentials(); err != nil {
		return nil, fmt.Errorf("control plane: credentials: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	etcdURL, err := cp.startEtcd(ctx, ports[0], ports[1])
	if err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx, etcdURL, ports[2]); err != nil {
		return nil, err
	}
	fmt.Fprintf(cp.log, "control plane: ready at %s in %s\n", cp.URL, time.Since(t0).Round(time.Millisecond))
	return cp, nil
}

// StartControlPlaneForTest starts a control plane in a new directory
// under os.TempDir and stops it when the test ends (t.Cleanup), failing
// the test if it cannot.
func StartControlPlaneForTest(tb testing.TB, opts Options) *ControlPlane {
	tb.Helper()
	dir, err := os.MkdirTemp("", "xdpq-e2e-")
	if err != nil {
		tb.Fatal(err)
	}
	if opts.Log == nil {
		opts.Log = testWriter{tb}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+20*time.Minute) // a fresh build included
	defer cancel()
	cp, err := StartControlPlane(ctx, dir, opts)
	if err != nil {
		tb.Fatal(errors.Join(err, os.RemoveAll(dir)))
	}
	tb.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return cp
}

// writeCredentials makes the CA, the apiserver's certificates, the
// service account key, the token file and the kubeconfigs.
func (cp *ControlPlane) writeCredentials() error {
	var err error
	if cp.ca, err = newCA(); err != nil {
		return err
	}
	cp.CAFile = cp.path("ca.crt")
	if err := os.WriteFile(cp.CAFile, cp.ca.pem, 0o644); err != nil {
		return err
	}
	hosts := []string{"127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "10.96.0.1"}
	if cp.Network != nil {
		hosts = append(hosts, cp.Network.Host.String())
	}
	serving, err := cp.ca.issue(pkix.Name{CommonName: "kube-apiserver"}, hosts...)
	if err != nil {
		return err
	}
	if err := serving.write(cp.path("apiserver.crt"), cp.path("apiserver.key")); err != nil {
		return err
	}
	// The apiserver's identity towards kubelets (logs, exec): kubelets
	// ask the apiserver whether it may (webhook authorization).
	kc, err := cp.ca.issue(pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}})
	if err != nil {
		return err
	}
	if err := kc.write(cp.path("apiserver-kubelet-client.crt"), cp.path("apiserver-kubelet-client.key")); err != nil {
		return err
	}
	cp.saKey = cp.path("sa.key")
	if err := serviceAccountKey(cp.saKey); err != nil {
		return err
	}
	// The static token file: token,user,uid,"group,...".
	users := []struct{ name, groups string }{
		{adminUser, "system:masters"},
		{"system:kube-controller-manager", ""},
		{"system:kube-scheduler", ""},
		{"system:node:" + cp.NodeName, "system:nodes"},
	}
	var b strings.Builder
	for _, u := range users {
		tok := randomToken()
		cp.tokens[u.name] = tok
		fmt.Fprintf(&b, "%s,%s,%s,%q\n", tok, u.name, u.name, u.groups)
	}
	return os.WriteFile(cp.path("tokens.csv"), []byte(b.String()), 0o600)
}

func (cp *ControlPlane) path(elem ...string) string {
	return filepath.Join(append([]string{cp.Dir}, elem...)...)
}

// startEtcd starts a single-member etcd listening on clientPort and
// peerPort and waits until it is healthy.
func (cp *ControlPlane) startEtcd(ctx context.Context, clientPort, peerPort int) (string, error) {
	client, peer := "http://"+hostPort(clientPort), "http://"+hostPort(peerPort)
	p, err := cp.start("etcd", kubebin.Etcd, []string{
		"--name=e2e",
		"--data-dir=" + cp.path("etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=e2e=" + peer,
		"--initial-cluster-state=new",
		// A test cluster's data is thrown away: no fsync.
		"--unsafe-no-fsync",
		"--log-level=warn",
	})
	if err != nil {
		return "", err
	}
	healthy := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, client+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }() // read, or its decoding failed: nothing to lose
		var h struct{ Health string }
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			return fmt.Errorf("/health: %w", err)
		}
		if h.Health != "true" {
			return fmt.Errorf("/health: %q", h.Health)
		}
		return nil
	}
	if err := waitReady(ctx, p, healthy); err != nil {
		return "", err
	}
	return client, nil
}

// startAPIServer starts kube-apiserver on port with its storage in etcd
// and waits until /readyz answers ok.
func (cp *ControlPlane) startAPIServer(ctx context.Context, etcd string, port int) error {
	addr := "127.0.0.1"
	// The kubelet listens on 127.0.0.1, which it refuses as its
	// InternalIP: reach it by its name. On the cluster's network each
	// kubelet listens on its node's address, its InternalIP.
	kubeletAddrs := "Hostname,InternalIP"
	if cp.Network != nil {
		addr, kubeletAddrs = cp.Network.Host.String(), "InternalIP,Hostname"
	}
	cp.URL = "https://" + net.JoinHostPort(addr, strconv.Itoa(port))
	p, err := cp.start("kube-apiserver", kubebin.KubeAPIServer, []string{
		"--etcd-servers=" + etcd,
		"--bind-address=" + addr,
		"--advertise-address=" + addr,
		"--secure-port=" + fmt.Sprint(port),
		// No Service of the apiserver's own endpoints: 127.0.0.1 is no
		// address a pod can reach.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + cp.path("apiserver-certs"),
		"--tls-cert-file=" + cp.path("apiserver.crt"),
		"--tls-private-key-file=" + cp.path("apiserver.key"),
		"--client-ca-file=" + cp.CAFile,
		"--token-auth-file=" + cp.path("tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + cp.saKey,
		"--service-account-signing-key-file=" + cp.saKey,
		"--kubelet-client-certificate=" + cp.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + cp.path("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + cp.CAFile,
		"--kubelet-preferred-address-types=" + kubeletAddrs,
		"--profiling=false",
		"--v=1",
	})
	if err != nil {
		return err
	}
	cp.Config = &rest.Config{
		Host:            cp.URL,
		BearerToken:     cp.tokens[adminUser],
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.ca.pem},
		QPS:             100,
		Burst:           200,
	}
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return fmt.Errorf("control plane: client: %w", err)
	}
	cp.Kubeconfig = cp.path("admin.kubeconfig")
	if err := cp.writeKubeconfig(cp.Kubeconfig, adminUser); err != nil {
		return err
	}
	cp.NodeKubeconfig = cp.path("node.kubeconfig")
	if err := cp.writeKubeconfig(cp.NodeKubeconfig, "system:node:"+cp.NodeName); err != nil {
		return err
	}
	ready := func(ctx context.Context) error {
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w: %s", err, body)
		}
		return nil
	}
	return waitReady(ctx, p, ready)
}

// writeKubeconfig writes a kubeconfig of user (a user of the token file)
// to path.
func (cp *ControlPlane) writeKubeconfig(path, user string) error {
	tok, ok := cp.tokens[user]
	if !ok {
		return fmt.Errorf("kubeconfig: no token for %s", user)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.ca.pem}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tok}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return nil
}

// writeCertKubeconfig writes a kubeconfig of a client certificate of
// the cluster's CA for subject (the user its CommonName, the groups its
// Organization) to path: a user the token file, fixed once the apiserver
// runs, does not have.
func (cp *ControlPlane) writeCertKubeconfig(path string, subject pkix.Name) error {
	kp, err := cp.ca.issue(subject)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.ca.pem}
	cfg.AuthInfos[subject.CommonName] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.cert, ClientKeyData: kp.key}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: subject.CommonName}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return nil
}

// start runs one of the binaries, registered for Stop.
func (cp *ControlPlane) start(name, bin string, args []string) (*process, error) {
	path, ok := cp.Binaries[bin]
	if !ok {
		return nil, fmt.Errorf("control plane: no %s binary in Options.Binaries", bin)
	}
	p, err := start(name, cp.Dir, path, args, nil)
	if err != nil {
		return nil, err
	}
	cp.mu.Lock()
	stopped := cp.stopped
	if !stopped {
		cp.procs = append(cp.procs, p)
	}
	cp.mu.Unlock()
	if stopped { // by a Ctrl-C while it started
		return nil, errors.Join(errors.New("control plane: stopped"), p.stop())
	}
	fmt.Fprintf(cp.log, "control plane: started %s (pid %d), log %s\n", name, p.cmd.Process.Pid, p.log)
	return p, nil
}

// Kubectl runs the real kubectl against the cluster as its admin and
// returns its standard output; an error includes its standard error.
func (cp *ControlPlane) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	path, ok := cp.Binaries[kubebin.Kubectl]
	if !ok {
		return nil, errors.New("kubectl: not in the control plane's binaries")
	}
	cmd := exec.CommandContext(ctx, path, append([]string{"--kubeconfig=" + cp.Kubeconfig}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Helm runs the Helm CLI (built by kubebin unless Options.Binaries has
// it) against the cluster as its admin, with its cache, configuration
// and data in Dir, and returns its standard output; an error includes
// its standard error.
func (cp *ControlPlane) Helm(ctx context.Context, args ...string) ([]byte, error) {
	path, ok := cp.Binaries[kubebin.Helm]
	if !ok {
		bins, err := kubebin.Ensure(ctx, kubebin.Options{Progress: cp.log}, kubebin.Helm)
		if err != nil {
			return nil, err
		}
		path = bins[kubebin.Helm]
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+cp.Kubeconfig,
		"HELM_CACHE_HOME="+cp.path("helm", "cache"),
		"HELM_CONFIG_HOME="+cp.path("helm", "config"),
		"HELM_DATA_HOME="+cp.path("helm", "data"),
	)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Token returns the bearer token of a user of the static token file:
// "system:kube-controller-manager", "system:kube-scheduler" or
// "system:node:<NodeName>".
func (cp *ControlPlane) Token(user string) string { return cp.tokens[user] }

// Stop stops the apiserver and etcd (SIGTERM, then SIGKILL to their
// process groups) and removes Dir. It is safe to call more than once and
// concurrently (the test's cleanup and a Ctrl-C); every call returns the
// first one's result.
func (cp *ControlPlane) Stop() error {
	cp.stopOnce.Do(func() {
		cp.cancel()
		cp.mu.Lock()
		procs := cp.procs
		cp.procs, cp.stopped = nil, true
		cp.mu.Unlock()
		var errs []error
		for i := len(procs) - 1; i >= 0; i-- {
			errs = append(errs, procs[i].stop())
		}
		if err := os.RemoveAll(cp.Dir); err != nil {
			errs = append(errs, fmt.Errorf("control plane: remove %s: %w", cp.Dir, err))
		}
		if cp.Network != nil {
			errs = append(errs, cp.Network.stop())
		}
		cp.stopErr = errors.Join(errs...)
	})
	return cp.stopErr
}

// waitReady polls check, each 100 ms, until it succeeds, p exits, or
// startTimeout passes. A component says it is ready only when asked.
func waitReady(ctx context.Context, p *process, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.exitError()
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %v)\n%s", p.name, ctx.Err(), last, p.tail(30))
		case <-tick.C:
		}
	}
}

// testWriter writes lines to a test's log.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
