// Package kubelettest is kubelet's device plugin registration service and
// nothing more, for tests of the plugin side; test/e2e/devicemanager runs the real
// device manager.
package kubelettest

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Registry serves kubelet.sock and passes every registration on.
type Registry struct {
	pluginapi.UnimplementedRegistrationServer
	srv *grpc.Server
	// Registrations receives each RegisterRequest.
	Registrations chan *pluginapi.RegisterRequest
}

// Register takes a registration.
func (r *Registry) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.Registrations <- req
	return &pluginapi.Empty{}, nil
}

// Start serves kubelet.sock in dir until Stop or the end of the test.
func Start(tb testing.TB, dir string) *Registry {
	tb.Helper()
	return StartWith(tb, dir, make(chan *pluginapi.RegisterRequest, 8))
}

// StartWith is Start passing registrations to ch (to keep one channel
// across a kubelet restart).
func StartWith(tb testing.TB, dir string, ch chan *pluginapi.RegisterRequest) *Registry {
	tb.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		tb.Fatal(err)
	}
	r := &Registry{srv: grpc.NewServer(), Registrations: ch}
	pluginapi.RegisterRegistrationServer(r.srv, r)
	// nil after Stop; a Serve that fails leaves the registration
	// unanswered, which the test waiting for it reports.
	go func() { _ = r.srv.Serve(ln) }()
	tb.Cleanup(r.Stop)
	return r
}

// Stop stops serving.
func (r *Registry) Stop() { r.srv.Stop() }

// Dial connects to the device plugin serving at socket, as kubelet does;
// the connection closes when the test ends.
func Dial(tb testing.TB, socket string) pluginapi.DevicePluginClient {
	tb.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := conn.Close(); err != nil {
			tb.Error(err)
		}
	})
	return pluginapi.NewDevicePluginClient(conn)
}
