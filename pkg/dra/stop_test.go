package dra

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// blockingNode is a fakeNode whose UnprepareClaim waits for release.
type blockingNode struct {
	*fakeNode
	entered, release chan struct{}
}

func (n blockingNode) UnprepareClaim(ctx context.Context, uid string) error {
	close(n.entered)
	<-n.release
	return n.fakeNode.UnprepareClaim(ctx, uid)
}

// TestStopAnswersFirst: the driver stopped while kubelet's Unprepare is
// under way (the uninstall ends as the last claim is unprepared) lets the
// call finish and its answer reach kubelet. The library's server stops
// without draining: kubelet got "Unavailable: error reading from server:
// EOF" for a claim the daemon had unprepared, and would retry it against
// a driver that is gone, its pod Terminating for good.
func TestStopAnswersFirst(t *testing.T) {
	fn := &fakeNode{devices: testDevices(), edits: testEdits}
	node := blockingNode{fn, make(chan struct{}), make(chan struct{})}
	c := startCluster(t, node, fn, fakeClientset())
	conn, err := grpc.NewClient("unix://"+filepath.Join(c.dir, "plugin", "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kubelet := drapb.NewDRAPluginClient(conn)
	answered := make(chan error, 1)
	go func() {
		resp, err := kubelet.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{
			Claims: []*drapb.Claim{{Namespace: "default", Name: "held", Uid: "uid-1"}}})
		if err == nil && resp.Claims["uid-1"].GetError() != "" {
			err = errors.New(resp.Claims["uid-1"].GetError())
		}
		answered <- err
	}()
	<-node.entered
	stopped := make(chan struct{})
	go func() {
		c.d.Stop()
		close(stopped)
	}()
	close(node.release)
	if err := <-answered; err != nil {
		t.Fatalf("kubelet's Unprepare, the driver stopping under it: %v", err)
	}
	<-stopped
	if _, unprepared := fn.asked(); len(unprepared) != 1 || unprepared[0] != "uid-1" {
		t.Errorf("the node was asked to unprepare %v, want uid-1", unprepared)
	}
}
