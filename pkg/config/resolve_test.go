package config

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/nic"
)

func TestResolve(t *testing.T) {
	netdevs := []nic.Netdev{
		{Name: "ens1f0", Driver: "ice", Vendor: "8086", Device: "1592", PCI: "0000:3b:00.0", RXQueues: 16},
		{Name: "ens1f1", Driver: "ice", Vendor: "8086", Device: "1592", PCI: "0000:3b:00.1", RXQueues: 16},
		{Name: "enp94s0", Driver: "mlx5_core", Vendor: "15b3", Device: "1017", PCI: "0000:5e:00.0", RXQueues: 8},
		{Name: "enp94s1", Driver: "mlx5_core", Vendor: "15b3", Device: "1017", PCI: "0000:5e:00.1", RXQueues: 8},
		{Name: "veth0", Virtual: true, RXQueues: 1},
	}
	c, err := Parse([]byte(`
pools:
  - name: upf
    devices: {netdevs: ["ens1f0#8-15", "ens1f1#8-15", "ens9#0-1"]}
  - name: dns
    devices: {drivers: [mlx5_core]}
    queues: "4-7"
  - name: intel-low
    devices: {vendors: ["8086"]}
    queues: "12-13"
  - name: dpdk
    mode: netdev
    devices: {pciAddresses: ["0000:5e:00.1"]}
  - name: too-far
    devices: {netdevs: ["enp94s0#8"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	res, problems := Resolve(c.ForNode("n", nil), netdevs)
	got := map[string][]uint32{}
	for _, r := range res {
		got[r.Pool+"/"+r.Netdev.Name] = r.Queues
	}
	want := map[string][]uint32{
		"upf/ens1f0":  {8, 9, 10, 11, 12, 13, 14, 15},
		"upf/ens1f1":  {8, 9, 10, 11, 12, 13, 14, 15},
		"dns/enp94s0": {4, 5, 6, 7},
		"dns/enp94s1": {4, 5, 6, 7},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reservations %v, want %v", got, want)
	}
	var msgs []string
	for _, p := range problems {
		msgs = append(msgs, p.Error())
	}
	all := strings.Join(msgs, "\n")
	for _, w := range []string{
		"pool upf: netdev ens9 is not on this node",
		"pool intel-low: queue 12 of ens1f0 is pool upf's",
		"pool dpdk: queue 4 of enp94s1 is pool dns's",
		"pool too-far: enp94s0 has 8 rx queues, so no queue 8",
	} {
		if !strings.Contains(all, w) {
			t.Errorf("problems lack %q:\n%s", w, all)
		}
	}
}

// TestSchemaUpToDate: docs/config.schema.json is what the types generate
// (`go generate ./pkg/config` rewrites it).
func TestSchemaUpToDate(t *testing.T) {
	want, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("docs/config.schema.json is stale: run make generate")
	}
	for _, field := range []string{"maxUMEMBytes", "pciAddresses", "busyPoll", "resourcePrefix", `"enum"`} {
		if !bytes.Contains(want, []byte(field)) {
			t.Errorf("schema lacks %s", field)
		}
	}
}

// TestChartSchemaUpToDate: the Helm chart's values.schema.json holds the
// config's schema as $defs.config (`go generate ./pkg/config` rewrites
// it), and its config value refers to it.
func TestChartSchemaUpToDate(t *testing.T) {
	got, err := os.ReadFile("../../charts/xdpq/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	want, err := EmbedSchema(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("charts/xdpq/values.schema.json is stale: run make generate")
	}
	if !bytes.Contains(got, []byte(`"$ref": "#/$defs/config"`)) {
		t.Error(`values.schema.json's config does not refer to #/$defs/config`)
	}
}

func TestEmbedSchemaRefuses(t *testing.T) {
	if _, err := EmbedSchema([]byte("{not json")); err == nil || !strings.HasPrefix(err.Error(), "embed the config schema: ") {
		t.Errorf("EmbedSchema of a broken document: %v", err)
	}
}
