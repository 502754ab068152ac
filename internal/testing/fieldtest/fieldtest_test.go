package fieldtest

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"
)

// mode is an enumeration whose zero and large values are invalid.
type mode uint8

type inner struct {
	Name   string
	Port   uint16
	Small  int8
	Flag   bool
	When   time.Time
	Addr   netip.Addr
	Prefix netip.Prefix
}

type outer struct {
	ID      int
	Mode    mode
	Inner   inner
	Ptr     *inner
	List    []inner
	Strings []string
	skipped int
}

// TestFill: every exported field is filled, none alike: a string with its
// path, a number with the count, a pointer and each of a slice's two
// elements in turn; a Value gives its type's values.
func TestFill(t *testing.T) {
	var got outer
	Fill(t, &got, Value(func(int) mode { return 2 }))
	at := func(n int) inner { // n counts the inner struct itself
		return inner{Port: uint16(n + 2), Small: int8(n + 3), Flag: true,
			When:   time.Date(2026, 1, 2, 3, 4, 5, n+5, time.UTC),
			Addr:   netip.AddrFrom4([4]byte{10, 1, 0, byte(n + 6)}),
			Prefix: netip.MustParsePrefix(fmt.Sprintf("10.0.0.%d/32", n+7))}
	}
	named := func(in inner, path string) inner { in.Name = path + ".Name"; return in }
	// No exported field of want is zero.
	want := outer{ID: 2, Mode: 2,
		Inner:   named(at(4), "outer.Inner"),
		Ptr:     new(named(at(13), "outer.Ptr")),
		List:    []inner{named(at(22), "outer.List[0]"), named(at(30), "outer.List[1]")},
		Strings: []string{"outer.Strings[0]", "outer.Strings[1]"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("filled\n%+v\nwant\n%+v", got, want)
	}
}

// TestFillWraps: a small integer filled once the count is past its range
// is still not zero.
func TestFillWraps(t *testing.T) {
	var v struct {
		I [][][][][][][][][]int8 // 1023 values, 512 of them int8
		U [][][][][][][][][]uint8
	}
	Fill(t, &v)
	var zero func(v reflect.Value) bool
	zero = func(v reflect.Value) bool {
		if v.Kind() != reflect.Slice {
			return v.IsZero()
		}
		for i := range v.Len() {
			if zero(v.Index(i)) {
				return true
			}
		}
		return false
	}
	if zero(reflect.ValueOf(v.I)) || zero(reflect.ValueOf(v.U)) {
		t.Error("an integer left zero")
	}
}

// TestLost: a field the copy dropped is named by its path, through
// pointers and slices; a time at the same instant elsewhere is not lost.
func TestLost(t *testing.T) {
	var want outer
	Fill(t, &want, Value(func(int) mode { return 2 }))
	got := want
	got.Ptr = new(inner)
	*got.Ptr = *want.Ptr
	got.List = slices.Clone(want.List)
	got.Inner.When = want.Inner.When.In(time.FixedZone("x", 3600))
	if l := Lost(want, got); len(l) != 0 {
		t.Errorf("an equal copy lost %v", l)
	}

	got.Ptr.Port = 0
	got.List[1].Addr = netip.Addr{}
	got.Inner.When = got.Inner.When.Add(1)
	got.Strings = got.Strings[:1]
	got.skipped = 1
	dropped := []string{"outer.Inner.When", "outer.Ptr.Port", "outer.List[1].Addr", "outer.Strings"}
	if l := Lost(want, got); !slices.Equal(l, dropped) {
		t.Errorf("lost %v, want %v", l, dropped)
	}
	got.Ptr = nil
	if l := Lost(want, got); !slices.Contains(l, "outer.Ptr") {
		t.Errorf("a nil pointer not named: %v", l)
	}
}
