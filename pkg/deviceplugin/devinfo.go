package deviceplugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/xdpq/xdpq/internal/atomicfile"
)

// DeviceInfoDir is where device plugins leave device-info files for CNI
// plugins (k8snetworkplumbingwg device-info-spec v1.1.0), which find them
// by resource name and device id.
//
// The network-attachment-definition client library writes these too, but
// it would bring client-go into the daemon for a dozen lines; this follows
// its file naming (utils.getDPDeviceInfoPath) and mode.
const DeviceInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"

// deviceInfo is the spec's DeviceInfo for a PCI device.
type deviceInfo struct {
	Type    string     `json:"type"`
	Version string     `json:"version"`
	PCI     *pciDevice `json:"pci,omitempty"`
}

type pciDevice struct {
	PCIAddress string `json:"pci-address"`
}

// DeviceInfoPath is the file of one device of a resource in dir.
func DeviceInfoPath(dir, resource, deviceID string) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%s-device.json",
		strings.ReplaceAll(resource, "/", "-"), strings.ReplaceAll(deviceID, "/", "-")))
}

// WriteDeviceInfo writes the device-info file of a queue of the NIC at
// pciAddress. The spec has no type for a NIC queue; a CNI plugin gets
// the NIC as a PCI device and the queue from the device id.
func WriteDeviceInfo(dir, resource, deviceID, pciAddress string) error {
	if pciAddress == "" {
		return errors.New("device info: the spec describes PCI devices; this netdev has no PCI address")
	}
	b, err := json.Marshal(deviceInfo{Type: "pci", Version: "1.1.0", PCI: &pciDevice{PCIAddress: pciAddress}})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("device info: %w", err)
	}
	path := DeviceInfoPath(dir, resource, deviceID)
	if err := atomicfile.WriteFile(path, b, 0o444); err != nil { // over a previous allocation's
		return fmt.Errorf("device info: %w", err)
	}
	return nil
}

// RemoveDeviceInfo removes a device's file; a missing one is no error.
func RemoveDeviceInfo(dir, resource, deviceID string) error {
	if err := os.Remove(DeviceInfoPath(dir, resource, deviceID)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("device info: %w", err)
	}
	return nil
}
