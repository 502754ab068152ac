package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

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
	fillMoved(t, reflect.ValueOf(&want).Elem(), "movedRecord", new(int))
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
	if lost := lostMovedFields(reflect.ValueOf(want), reflect.ValueOf(got), "movedRecord"); len(lost) != 0 {
		t.Errorf("fields lost by the record: %s\nwritten: %s", strings.Join(lost, ", "), b)
	}

	// The test can fail: a field the record would drop is named.
	got.Policy.Linger = 0
	got.Device.XDP = 0
	got.Policy.Reserved = got.Policy.Reserved[:1]
	lost := lostMovedFields(reflect.ValueOf(want), reflect.ValueOf(got), "movedRecord")
	for _, f := range []string{"movedRecord.Policy.Linger", "movedRecord.Device.XDP", "movedRecord.Policy.Reserved"} {
		if !slices.Contains(lost, f) {
			t.Errorf("%s dropped, not named: %v", f, lost)
		}
	}
}

// fillMoved gives every exported field of v a value that is not zero,
// and distinct from the others' where its type allows, so that a field
// converted into another is seen too. n counts the fields filled.
func fillMoved(t *testing.T, v reflect.Value, path string, n *int) {
	t.Helper()
	*n++
	if v.Type() == reflect.TypeFor[xdp.Mode]() {
		v.Set(reflect.ValueOf(xdp.ModeGeneric)) // one that has a number
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(path)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fillMoved(t, v.Index(i), fmt.Sprintf("%s[%d]", path, i), n)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				fillMoved(t, v.Field(i), path+"."+f.Name, n)
			}
		}
		if v.IsZero() {
			t.Fatalf("%s: this test cannot fill a %s (no exported field) yet; teach fillMoved", path, v.Type())
		}
	default:
		t.Fatalf("%s: this test cannot fill a %s yet; teach fillMoved", path, v.Type())
	}
}

// lostMovedFields lists the exported fields of want that got does not
// hold.
func lostMovedFields(want, got reflect.Value, path string) []string {
	var lost []string
	switch want.Kind() {
	case reflect.Struct:
		for i := range want.NumField() {
			if f := want.Type().Field(i); f.IsExported() {
				lost = append(lost, lostMovedFields(want.Field(i), got.Field(i), path+"."+f.Name)...)
			}
		}
	case reflect.Slice:
		if want.Len() != got.Len() {
			return []string{path}
		}
		for i := range want.Len() {
			lost = append(lost, lostMovedFields(want.Index(i), got.Index(i), fmt.Sprintf("%s[%d]", path, i))...)
		}
	default:
		if !reflect.DeepEqual(want.Interface(), got.Interface()) {
			return []string{path}
		}
	}
	return lost
}
