package kubelet

import (
	"testing"

	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

func TestProbe(t *testing.T) { _ = devicemanager.NewManagerImpl }
