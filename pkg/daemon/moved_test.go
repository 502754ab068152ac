package daemon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/fieldtest"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestMovedGolden: every moved netdev record an older daemon wrote reads
// as the record it describes, and this daemon writes that record back as
// the same bytes, with the version first: the files of version 1 predate
// it, and a record without one is read as version 1.
func TestMovedGolden(t *testing.T) {
	for _, g := range movedGoldens {
		t.Run(g.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", g.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeMoved(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, g.rec) {
				t.Errorf("read %+v\nwant %+v", got, g.rec)
			}
			if err := got.Mover.Validate(); err != nil {
				t.Error(err)
			}
			out, err := json.Marshal(got) // as prepareMove writes it
			if err != nil {
				t.Fatal(err)
			}
			if want := `{"version":1,` + string(b[1:]); string(out) != want {
				t.Errorf("written back as\n%s\nnot\n%s", out, want)
			}
		})
	}
}

// TestMovedVersion: a record of a version this daemon does not know, or
// with an XDP mode version 1 has no number for, is refused, saying so.
func TestMovedVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "moved-v1-veth.json"))
	if err != nil {
		t.Fatal(err)
	}
	v1 := `{"version":1,` + string(b[1:])
	for _, tc := range []struct{ name, rec, err string }{
		{"newer", strings.Replace(v1, `"version":1`, `"version":2`, 1),
			"moved netdev record version 2 is newer than the 1 this daemon reads: a newer xdpq wrote it"},
		{"unknown", strings.Replace(v1, `"version":1`, `"version":-1`, 1),
			"moved netdev record version -1 is not read by this daemon (it reads 1)"},
		{"not a number", strings.Replace(v1, `"version":1`, `"version":"1"`, 1), "cannot unmarshal string"},
		{"a field of another type", strings.Replace(v1, `"Linger":1500000000`, `"Linger":"1.5s"`, 1),
			"moved netdev record version 1: json: cannot unmarshal string"},
		{"a mode without a number", strings.Replace(v1, `"Mode":3`, `"Mode":5`, 1),
			"moved netdev record version 1: policy: XDP mode 5 unknown"},
	} {
		if _, err := decodeMoved([]byte(tc.rec)); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
	rec := movedGoldens[0].rec
	rec.Policy.Mode = xdp.Mode(len(modesV1))
	if _, err := json.Marshal(rec); err == nil || !strings.Contains(err.Error(), "has no number in version 1") {
		t.Errorf("a mode without a number written: %v", err)
	}
}

// TestMovedCarriesEveryField: every exported field of a moved netdev
// record, down to its device's and its policy's, is written and read
// back. A field added to nic.Netdev, agent.Policy (or the types they
// hold) fails here until movedV1 and its converters carry it (in a new
// record version if an older daemon must not misread it); one added to
// mover.Record, whose format pkg/mover owns, fails here and in pkg/mover.
func TestMovedCarriesEveryField(t *testing.T) {
	var want movedRecord
	// A mode version 1 has a number for: the others are refused.
	fieldtest.Fill(t, &want, fieldtest.Value(func(int) xdp.Mode { return xdp.ModeGeneric }))
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	r, err := readMovedV1(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.record()
	if err != nil {
		t.Fatal(err)
	}
	if lost := fieldtest.Lost(want, got); len(lost) != 0 {
		t.Errorf("fields lost by the record: %s\nwritten: %s", strings.Join(lost, ", "), b)
	}

	// The test can fail: a field the record would drop is named.
	got.Policy.Linger = 0
	got.Device.XDP = 0
	got.Policy.Reserved = got.Policy.Reserved[:1]
	lost := fieldtest.Lost(want, got)
	for _, f := range []string{"movedRecord.Policy.Linger", "movedRecord.Device.XDP", "movedRecord.Policy.Reserved"} {
		if !slices.Contains(lost, f) {
			t.Errorf("%s dropped, not named: %v", f, lost)
		}
	}
}
