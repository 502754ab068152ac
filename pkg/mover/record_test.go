package mover

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/testing/fieldtest"
)

func validRecord() Record {
	return Record{Name: "xa", Index: 3, Temp: "xdpq3", Kind: "veth", IfName: "net1", MTU: 1400,
		Node: State{MTU: 1500, MAC: "02:58:44:50:51:01", AltNames: []string{"enp59s0f0v1"}, TxQLen: 1000, Up: true}}
}

func TestValidate(t *testing.T) {
	if err := (&Record{}).Validate(); err == nil {
		t.Error("the zero Record is valid")
	}
	for _, tc := range []struct {
		name   string
		change func(*Record)
		want   string // "" for valid
	}{
		{"valid", func(*Record) {}, ""},
		{"a physical one", func(r *Record) { r.Kind, r.Parent, r.PermAddr = "device", "pci/0000:3b:02.1", "3c:fd:fe:00:00:01" }, ""},
		{"no name", func(r *Record) { r.Name = "" }, "name: empty interface name"},
		{"long ifName", func(r *Record) { r.IfName = "sixteen-bytes-xx" }, "longer than 15"},
		{"slash", func(r *Record) { r.IfName = "a/b" }, "'/'"},
		{"dot", func(r *Record) { r.Name = ".." }, "not allowed"},
		{"long altname", func(r *Record) { r.Node.AltNames = []string{strings.Repeat("a", 128)} }, "longer than 127"},
		{"altname with a space", func(r *Record) { r.Node.AltNames = []string{"a b"} }, "white space"},
		{"index", func(r *Record) { r.Index = 0 }, "not an ifindex"},
		{"someone else's temp", func(r *Record) { r.Temp = "eth0" }, `want "xdpq3"`},
		{"no kind", func(r *Record) { r.Kind = "" }, "kind: empty"},
		{"mtu", func(r *Record) { r.MTU = -1 }, "negative"},
		{"txqlen", func(r *Record) { r.Node.TxQLen = -1 }, "negative"},
		{"mac", func(r *Record) { r.Node.MAC = "02:58" }, "mac:"},
		{"alias", func(r *Record) { r.Node.Alias = strings.Repeat("a", 256) }, "255"},
	} {
		r := validRecord()
		tc.change(&r)
		err := r.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		case err != nil && !strings.HasPrefix(err.Error(), "netdev record "):
			t.Errorf("%s: %v: no context", tc.name, err)
		}
	}
}

// TestOurs pins the marks that find a netdev: its temporary name, its
// alias, on the node its name with its ifindex, and for a netdev with a
// hardware identity that alone.
func TestOurs(t *testing.T) {
	virt := validRecord()
	phys := validRecord()
	phys.Kind, phys.Parent, phys.PermAddr = "device", "pci/0000:3b:02.1", "3c:fd:fe:00:00:01"
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	vf := func(name, alias string) *netlink.LinkAttrs {
		return &netlink.LinkAttrs{Name: name, Alias: alias, Index: 40, ParentDevBus: "pci", ParentDev: "0000:3b:02.1", PermHWAddr: mac("3c:fd:fe:00:00:01")}
	}
	for _, tc := range []struct {
		name string
		r    Record
		a    *netlink.LinkAttrs
		s    space
		want bool
	}{
		{"temp in the pod", virt, &netlink.LinkAttrs{Name: "xdpq3", Index: 9}, spacePod, true},
		{"alias in the pod", virt, &netlink.LinkAttrs{Name: "net1", Alias: "xa", Index: 9}, spacePod, true},
		{"the pod's own net1", virt, &netlink.LinkAttrs{Name: "net1", Index: 3}, spacePod, false},
		{"a pod link named like the node's", virt, &netlink.LinkAttrs{Name: "xa", Index: 3}, spacePod, false},
		{"name and index on the node", virt, &netlink.LinkAttrs{Name: "xa", Index: 3}, spaceNode, true},
		{"another xa on the node", virt, &netlink.LinkAttrs{Name: "xa", Index: 5}, spaceNode, false},
		{"returned with its alias", virt, &netlink.LinkAttrs{Name: "dev3", Alias: "xa", Index: 3}, spaceInit, true},
		{"name and index in the initial namespace", virt, &netlink.LinkAttrs{Name: "xa", Index: 3}, spaceInit, false},
		{"a VF stripped of its marks", phys, vf("renamed", ""), spacePod, true},
		{"another VF", phys, &netlink.LinkAttrs{Name: "xa", Alias: "xa", Index: 3, ParentDevBus: "pci", ParentDev: "0000:3b:02.2"}, spaceNode, false},
	} {
		if got := tc.r.ours(tc.a, tc.s); got != tc.want {
			t.Errorf("%s: ours = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// FuzzRecord feeds arbitrary JSON where a persisted Record is read back:
// decoding and Validate never panic, and a valid Record survives a round
// trip unchanged.
func FuzzRecord(f *testing.F) {
	good, _ := json.Marshal(validRecord())
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"name":"xa","index":3,"temp":"xdpq3","kind":"device","node":{"mtu":1500,"mac":"zz"},"ifName":"net1"}`))
	f.Add([]byte(`{"name":"xa","index":-1,"temp":"xdpq-1","kind":"veth","ifName":"a/b","mtu":-5}`))
	f.Add([]byte(`{"name":"xa","node":{"altNames":["", "x y"]}}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Record
		if json.Unmarshal(b, &r) != nil {
			return
		}
		if r.Validate() != nil {
			return
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var back Record
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normal(back), normal(r)) {
			t.Fatalf("round trip: %+v != %+v", back, r)
		}
		if err := back.Validate(); err != nil {
			t.Fatal(err)
		}
	})
}

// normal makes an empty alternative name list nil, as JSON's omitempty
// does.
func normal(r Record) Record {
	if len(r.Node.AltNames) == 0 {
		r.Node.AltNames = nil
	}
	return r
}

// TestRecordGolden: every record an older daemon persisted reads as the
// Record it describes, and is written back the same but for the version,
// which records before version 1 lack.
func TestRecordGolden(t *testing.T) {
	for _, g := range goldens {
		t.Run(g.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", g.file))
			if err != nil {
				t.Fatal(err)
			}
			var got Record
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, g.rec) {
				t.Errorf("read %+v\nwant %+v", got, g.rec)
			}
			if err := got.Validate(); err != nil {
				t.Error(err)
			}
			out, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			if want := `{"version":1,` + string(b[1:]); string(out) != want {
				t.Errorf("written back as\n%s\nnot\n%s", out, want)
			}
		})
	}
}

// TestRecordVersion: a record of a version this mover does not know is
// refused; an older version is read through its reader.
func TestRecordVersion(t *testing.T) {
	for _, tc := range []struct{ rec, err string }{
		{`{"version":2,"name":"xa"}`, "netdev record version 2 is newer than the 1 this daemon reads: a newer xdpq wrote it"},
		{`{"version":-1,"name":"xa"}`, "netdev record version -1 is not read by this daemon (it reads 1)"},
		{`{"version":"1","name":"xa"}`, "cannot unmarshal string"},
		{`{"version":1,"name":7}`, "netdev record version 1: json: cannot unmarshal number"},
	} {
		var r Record
		if err := json.Unmarshal([]byte(tc.rec), &r); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.rec, err, tc.err)
		}
	}

	// A version -1 that named the netdev "dev", were there one: its
	// reader converts it to the current record.
	readers := recordReaders()
	readers[-1] = func(b []byte) (recordV1, error) {
		var r struct {
			recordV1
			Dev string `json:"dev"`
		}
		err := json.Unmarshal(b, &r)
		r.Name = r.Dev
		return r.recordV1, err
	}
	rec, err := decodeRecord([]byte(`{"version":-1,"dev":"xa","index":3,"temp":"xdpq3","kind":"veth","ifName":"net1"}`), readers)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rec.record(), (Record{Name: "xa", Index: 3, Temp: "xdpq3", Kind: "veth", IfName: "net1"}); !reflect.DeepEqual(got, want) {
		t.Errorf("version -1 read as %+v, want %+v", got, want)
	}
}

// TestRecordCarriesEveryField: every field of a Record is written and
// read back. A field added to Record or State fails here until recordV1
// and its converters carry it (in a new record version if an older daemon
// must not misread it).
func TestRecordCarriesEveryField(t *testing.T) {
	var want Record
	fieldtest.Fill(t, &want)
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got Record
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if lost := fieldtest.Lost(want, got); len(lost) != 0 {
		t.Errorf("fields lost by the record: %s\nwritten: %s", strings.Join(lost, ", "), b)
	}

	// The test can fail: a field the record would drop is named.
	got.Node.Multicast = false
	if lost := fieldtest.Lost(want, got); !slices.Contains(lost, "Record.Node.Multicast") {
		t.Errorf("Node.Multicast dropped, not named: %v", lost)
	}
}
