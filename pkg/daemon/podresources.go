package daemon

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is kubelet's PodResources API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// kubeletAPI asks kubelet at its socket ("" for the default path).
type kubeletAPI struct{ socket string }

// call calls the API with a 10 s timeout.
func (k kubeletAPI) call(ctx context.Context, call func(context.Context, podresources.PodResourcesListerClient) error) error {
	path := k.socket
	if path == "" {
		path = DefaultPodResourcesSocket
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }() // a client whose one call was answered or failed
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := call(ctx, podresources.NewPodResourcesListerClient(conn)); err != nil {
		return fmt.Errorf("kubelet pod resources at %s: %w", path, err)
	}
	return nil
}

// heldDevices asks kubelet which devices running containers hold, as
// "<resource>/<device id>".
func (k kubeletAPI) heldDevices(ctx context.Context) (map[string]bool, error) {
	var resp *podresources.ListPodResourcesResponse
	err := k.call(ctx, func(ctx context.Context, c podresources.PodResourcesListerClient) (err error) {
		resp, err = c.List(ctx, &podresources.ListPodResourcesRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	held := map[string]bool{}
	for _, p := range resp.PodResources {
		for _, c := range p.Containers {
			for _, dev := range c.Devices {
				for _, id := range dev.DeviceIds {
					held[dev.ResourceName+"/"+id] = true
				}
			}
		}
	}
	return held, nil
}

// podDevices asks kubelet for the devices the pod's containers hold, by
// resource name.
func (k kubeletAPI) podDevices(ctx context.Context, namespace, name string) (map[string][]string, error) {
	var resp *podresources.GetPodResourcesResponse
	err := k.call(ctx, func(ctx context.Context, c podresources.PodResourcesListerClient) (err error) {
		resp, err = c.Get(ctx, &podresources.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
		if err != nil {
			err = fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	devs := map[string][]string{}
	for _, c := range resp.GetPodResources().GetContainers() {
		for _, dev := range c.Devices {
			devs[dev.ResourceName] = append(devs[dev.ResourceName], dev.DeviceIds...)
		}
	}
	return devs, nil
}
