// Package fieldtest is for tests only: it fills a value so that every
// exported field holds something, and names the fields a copy of it lost.
// A test of an on-disk record fills the in-memory type, converts it to
// the record and back, and fails on every field the converters do not
// carry, so a field added to the type cannot be forgotten by its record.
package fieldtest

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"
)

// Option changes how Fill fills.
type Option func(*filler)

// Value makes Fill give each value of type T f(n), n the number of values
// filled so far, for a type the general rule cannot fill validly: an
// enumeration that only knows a few of its numbers, a struct without
// exported fields.
func Value[T any](f func(n int) T) Option {
	return func(fl *filler) {
		fl.values[reflect.TypeFor[T]()] = func(n int) reflect.Value { return reflect.ValueOf(f(n)) }
	}
}

// known fills the types without exported fields that Fill fills unasked.
func known() []Option {
	return []Option{
		Value(func(n int) time.Time { return time.Date(2026, 1, 2, 3, 4, 5, n, time.UTC) }),
		Value(func(n int) netip.Prefix {
			return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(n >> 8), byte(n)}), 32)
		}),
		Value(func(n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, byte(n >> 8), byte(n)}) }),
	}
}

// filler is one Fill's: the values given by type, and the count of
// values filled.
type filler struct {
	tb     testing.TB
	values map[reflect.Type]func(n int) reflect.Value
	n      int
}

// Fill gives every exported field of *v, through pointers, slices and
// structs, a value that is not zero and, where its type allows, differs
// from the others', so that a field converted into another is seen too:
// a string holds its own path ("Record.Node.MAC"), a number a count, a
// pointer a new value, a slice two elements. It fails the test on a type
// it cannot fill; an Option teaches it one.
func Fill[T any](tb testing.TB, v *T, opts ...Option) {
	tb.Helper()
	f := &filler{tb: tb, values: map[reflect.Type]func(int) reflect.Value{}}
	for _, o := range slices.Concat(known(), opts) {
		o(f)
	}
	f.fill(reflect.ValueOf(v).Elem(), root[T]())
}

func (f *filler) fill(v reflect.Value, path string) {
	f.tb.Helper()
	f.n++
	if value, ok := f.values[v.Type()]; ok {
		v.Set(value(f.n))
		if v.IsZero() {
			f.tb.Fatalf("%s: the value given for a %s is zero", path, v.Type())
		}
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(path)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		x := int64(f.n)
		if v.OverflowInt(x) { // wrap, never to zero
			x = x%(1<<(v.Type().Bits()-1)-1) + 1
		}
		v.SetInt(x)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		x := uint64(f.n)
		if v.OverflowUint(x) {
			x = x%(1<<v.Type().Bits()-1) + 1
		}
		v.SetUint(x)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		f.fill(v.Elem(), path)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			f.fill(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if sf := v.Type().Field(i); sf.IsExported() {
				f.fill(v.Field(i), path+"."+sf.Name)
			}
		}
		if v.IsZero() {
			f.tb.Fatalf("%s: fieldtest cannot fill a %s (no exported field); give it a fieldtest.Value", path, v.Type())
		}
	default:
		f.tb.Fatalf("%s: fieldtest cannot fill a %s yet; give it a fieldtest.Value or teach Fill", path, v.Type())
	}
}

// Lost lists the paths ("Record.Node.MAC", "Record.Attachments[0].Flows")
// of the exported fields of want that got does not hold. A struct without
// exported fields (a time.Time, a netip.Addr) is compared whole, by its
// Equal method if it has one; a slice of another length is named whole.
func Lost[T any](want, got T) []string {
	return lost(reflect.ValueOf(&want).Elem(), reflect.ValueOf(&got).Elem(), root[T]())
}

func lost(want, got reflect.Value, path string) []string {
	var l []string
	switch want.Kind() {
	case reflect.Struct:
		exported := false
		for i := range want.NumField() {
			if sf := want.Type().Field(i); sf.IsExported() {
				exported = true
				l = append(l, lost(want.Field(i), got.Field(i), path+"."+sf.Name)...)
			}
		}
		if exported {
			return l
		}
	case reflect.Pointer:
		if want.IsNil() || got.IsNil() {
			if want.IsNil() != got.IsNil() {
				return []string{path}
			}
			return nil
		}
		return lost(want.Elem(), got.Elem(), path)
	case reflect.Slice:
		if want.Len() != got.Len() {
			return []string{path}
		}
		for i := range want.Len() {
			l = append(l, lost(want.Index(i), got.Index(i), fmt.Sprintf("%s[%d]", path, i))...)
		}
		return l
	}
	if !equal(want, got) {
		return []string{path}
	}
	return nil
}

// equal compares by an Equal method, which a time.Time read back needs (it
// loses its monotonic reading and perhaps its location), else deeply.
func equal(a, b reflect.Value) bool {
	if m, ok := a.Type().MethodByName("Equal"); ok && m.Type.NumIn() == 2 && m.Type.In(1) == a.Type() &&
		m.Type.NumOut() == 1 && m.Type.Out(0).Kind() == reflect.Bool {
		return m.Func.Call([]reflect.Value{a, b})[0].Bool()
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// root names the value whose fields are walked: its type's name.
func root[T any]() string {
	t := reflect.TypeFor[T]()
	if t.Name() != "" {
		return t.Name()
	}
	return t.String()
}
