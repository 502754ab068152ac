package ledger

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/xdpq/xdpq/internal/testing/fieldtest"
)

// cmpAlloc compares allocations: times as instants, prefixes by value.
var cmpAlloc = []cmp.Option{
	cmp.AllowUnexported(Allocation{}),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
}

// TestRecordGolden: every record file an older daemon wrote reads as the
// allocation it describes, and this daemon writes that allocation back as
// the same bytes.
func TestRecordGolden(t *testing.T) {
	for _, g := range goldens {
		t.Run(g.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", g.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeRecord(b, g.alloc.ID, recordReaders())
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(&g.alloc, got, cmpAlloc...); d != "" {
				t.Errorf("read (-want +got):\n%s", d)
			}
			out, err := encodeRecord(got)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != string(b) {
				t.Errorf("written back as\n%s\nnot\n%s", out, b)
			}
		})
	}
}

// TestRecordGoldenOpen: a daemon that restarts on the golden files serves
// their allocations.
func TestRecordGoldenOpen(t *testing.T) {
	dir := t.TempDir()
	for _, g := range goldens {
		b, err := os.ReadFile(filepath.Join("testdata", g.file))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, g.alloc.ID+".json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l := open(t, dir)
	if br := l.Broken(); len(br) != 0 {
		t.Fatalf("broken: %v", br)
	}
	for _, g := range goldens {
		want := g.alloc
		want.Replaces = nil // done with once read (see Open)
		got, ok := l.Get(g.alloc.ID)
		if d := cmp.Diff(want, got, cmpAlloc...); !ok || d != "" {
			t.Errorf("%s (-want +got):\n%s", g.file, d)
		}
	}
}

// TestRecordVersion: a record of a version this daemon does not know is
// refused, named, and left on disk; an older version is read through its
// reader.
func TestRecordVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "v1-uid.json"))
	if err != nil {
		t.Fatal(err)
	}
	const id = "upf-0123456789ab"
	for _, tc := range []struct {
		name, version, err string
	}{
		{"newer", `"version":2`, "record version 2 is newer than the 1 this daemon reads: a newer xdpq wrote it"},
		{"none", `"version":0`, "record version 0 is not read by this daemon (it reads 1)"},
		{"not a number", `"version":"1"`, "cannot unmarshal string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, id+".json")
			rec := []byte(strings.Replace(string(b), `"version":1`, tc.version, 1))
			if err := os.WriteFile(path, rec, 0o600); err != nil {
				t.Fatal(err)
			}
			l := open(t, dir)
			err := l.Broken()[id]
			if err == nil || !strings.Contains(err.Error(), path+": ") || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("got %v, want %s: ...%s...", err, path, tc.err)
			}
			if _, ok := l.Get(id); ok {
				t.Error("served")
			}
			if got, _ := os.ReadFile(path); string(got) != string(rec) {
				t.Error("the record was changed")
			}
		})
	}

	// A version 0 whose owner was a bare uid, were there one: its reader
	// converts it to the current record, which is then checked as any.
	v0 := func(b []byte) (recordV1, error) {
		var r struct {
			recordV1
			UID uint32 `json:"uid"`
		}
		err := json.Unmarshal(b, &r)
		r.Owner = ownerV1{UID: &r.UID}
		return r.recordV1, err
	}
	readers := recordReaders()
	readers[0] = v0
	old := []byte(strings.Replace(strings.Replace(string(b), `"version":1`, `"version":0`, 1), `"owner":{"uid":1000}`, `"uid":1000`, 1))
	got, err := decodeRecord(old, id, readers)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&goldens[0].alloc, got, cmpAlloc...); d != "" {
		t.Errorf("version 0 read (-want +got):\n%s", d)
	}
	if _, err := decodeRecord([]byte(strings.Replace(string(old), `"state":"active"`, `"state":"gone"`, 1)), id, readers); err == nil ||
		!strings.Contains(err.Error(), `allocation state "gone"`) {
		t.Errorf("an older version's record is not checked: %v", err)
	}
}

// TestRecordCarriesEveryField: every exported field of an allocation, down
// to its attachments' flows, is written and read back. A field added to
// Allocation, Attachment, Owner, LeaseSocket or the api types an
// attachment holds fails here until recordV1 and its converters carry it
// (in a new record version if an older daemon must not misread it).
func TestRecordCarriesEveryField(t *testing.T) {
	var want Allocation
	fieldtest.Fill(t, &want, fieldtest.Value(func(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`[{"port":%d}]`, n)) }))
	b, err := encodeRecord(&want)
	if err != nil {
		t.Fatal(err)
	}
	r, err := readV1(b)
	if err != nil {
		t.Fatal(err)
	}
	got := r.allocation()
	if lost := fieldtest.Lost(want, *got); len(lost) != 0 {
		t.Errorf("fields lost by the record: %s\nwritten: %s", strings.Join(lost, ", "), b)
	}
	if d := cmp.Diff(&want, got, cmpAlloc...); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}

	// The test can fail: a field the record would drop is named.
	got.Attachments[0].Flows[0].VLAN = 0
	got.Owner.UID = nil
	lost := fieldtest.Lost(want, *got)
	for _, f := range []string{"Allocation.Owner.UID", "Allocation.Attachments[0].Attachment.CNIAddRequest.Flows[0].VLAN"} {
		if !slices.Contains(lost, f) {
			t.Errorf("%s dropped, not named: %v", f, lost)
		}
	}
}
