package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/xdpq/xdpq/pkg/flow"
)

// FieldError is one problem with the file, at a field path such as
// pools[1].devices.netdevs[0].
type FieldError struct {
	Path string
	Msg  string
}

func (e FieldError) Error() string { return e.Path + ": " + e.Msg }

// Error lists every problem found; the config is refused as a whole.
type Error struct{ Errors []FieldError }

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid config, %d problem(s):", len(e.Errors))
	for _, f := range e.Errors {
		b.WriteString("\n  " + f.Error())
	}
	return b.String()
}

// MaxSize is the largest config file accepted.
const MaxSize = 1 << 20

// Parse reads a YAML or JSON config and validates it. Unknown fields are
// errors; every error names its field.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxSize {
		return nil, &Error{[]FieldError{{"(file)", fmt.Sprintf("%d bytes; at most %d", len(data), MaxSize)}}}
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, &Error{[]FieldError{{"(file)", "not YAML or JSON: " + err.Error()}}}
	}
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, &Error{[]FieldError{{"(file)", err.Error()}}}
	}
	if doc == nil {
		return nil, &Error{[]FieldError{{"(file)", "empty; a config has at least `pools:`"}}}
	}
	var errs []FieldError
	unknownFields(reflect.TypeOf(Config{}), doc, "", &errs)
	if len(errs) > 0 {
		return nil, &Error{errs}
	}
	var c Config
	if err := json.Unmarshal(js, &c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, &Error{[]FieldError{{jsonPath(te.Field), fmt.Sprintf("got %s, want %s", te.Value, typeName(te.Type))}}}
		}
		return nil, &Error{[]FieldError{{"(file)", err.Error()}}}
	}
	if errs := c.Validate(); len(errs) > 0 {
		return nil, &Error{errs}
	}
	return &c, nil
}

// jsonPath turns encoding/json's "pools.0.limits" into "pools[0].limits".
func jsonPath(p string) string {
	parts := strings.Split(p, ".")
	var b strings.Builder
	for _, s := range parts {
		if _, err := strconv.Atoi(s); err == nil {
			b.WriteString("[" + s + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteString(".")
		}
		b.WriteString(s)
	}
	return b.String()
}

func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	}
	return "a number (" + t.String() + ")"
}

// jsonFields maps the JSON names of a struct's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = f.Type
	}
	return out
}

// unknownFields reports every object key of doc that t has no field for,
// and every value of the wrong kind, each at its path.
func unknownFields(t reflect.Type, doc any, path string, errs *[]FieldError) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if doc == nil {
		return // null: the zero value
	}
	bad := func(want string) {
		*errs = append(*errs, FieldError{path, fmt.Sprintf("got %s, want %s", kindOf(doc), want)})
	}
	switch {
	case t == reflect.TypeOf(Duration{}):
		if _, ok := doc.(string); !ok {
			bad("a duration such as \"5s\"")
		}
		return
	case t.Kind() == reflect.String:
		if _, ok := doc.(string); !ok {
			bad("a string")
		}
		return
	case t.Kind() == reflect.Bool:
		if _, ok := doc.(bool); !ok {
			bad("true or false")
		}
		return
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		f, ok := doc.(float64)
		unsigned := t.Kind() >= reflect.Uint
		if !ok || f != float64(int64(f)) || (unsigned && f < 0) || f > 1<<53 {
			bad(map[bool]string{true: "a whole number, not negative", false: "a whole number"}[unsigned])
		}
		return
	case t.Kind() == reflect.Slice:
		if _, ok := doc.([]any); !ok {
			bad("a list")
			return
		}
	case t.Kind() == reflect.Struct || t.Kind() == reflect.Map:
		if _, ok := doc.(map[string]any); !ok {
			bad("an object")
			return
		}
	}
	switch v := doc.(type) {
	case map[string]any:
		if t.Kind() == reflect.Map {
			for k, e := range v {
				unknownFields(t.Elem(), e, join(path, k), errs)
			}
			return
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				allowed := make([]string, 0, len(fields))
				for n := range fields {
					allowed = append(allowed, n)
				}
				sort.Strings(allowed)
				*errs = append(*errs, FieldError{join(path, k), "unknown field; allowed: " + strings.Join(allowed, ", ")})
				continue
			}
			unknownFields(ft, v[k], join(path, k), errs)
		}
	case []any:
		if t.Kind() == reflect.Slice {
			for i, e := range v {
				unknownFields(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i), errs)
			}
		}
	}
}

func kindOf(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

var (
	poolName    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dnsSubdom   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	hexID       = regexp.MustCompile(`^[0-9a-f]{4}$`)
	pciAddress  = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	driverName  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	ifName      = regexp.MustCompile(`^[^/:\s]{1,15}$`)
	oneOf       = func(v string, allowed ...string) bool { return v == "" || slices.Contains(allowed, v) }
	allowedList = func(a ...string) string { return strings.Join(a, ", ") }
)

// Validate checks the config and returns every problem found.
func (c *Config) Validate() []FieldError {
	var errs []FieldError
	add := func(path, format string, args ...any) {
		errs = append(errs, FieldError{path, fmt.Sprintf(format, args...)})
	}
	if c.ResourcePrefix != "" && (len(c.ResourcePrefix) > 253 || !dnsSubdom.MatchString(c.ResourcePrefix)) {
		add("resourcePrefix", "%q is not a DNS subdomain such as xdpq.io", c.ResourcePrefix)
	}
	validatePools(c.Pools, "pools", add)
	for i, o := range c.Nodes {
		p := fmt.Sprintf("nodes[%d]", i)
		if len(o.Names) == 0 && len(o.Labels) == 0 {
			add(p, "selects no node: give names, labels or both")
		}
		// The override's pools, then the pools a matching node ends up with.
		validatePools(o.Pools, p+".pools", add)
		merged := slices.Clone(c.Pools)
		for _, op := range o.Pools {
			if k := slices.IndexFunc(merged, func(x Pool) bool { return x.Name == op.Name }); k >= 0 {
				merged[k] = op
			} else {
				merged = append(merged, op)
			}
		}
		errs = append(errs, claims(merged, p+" (with the base pools)")...)
	}
	errs = append(errs, claims(c.Pools, "pools")...)
	return errs
}

func validatePools(pools []Pool, base string, add func(string, string, ...any)) {
	names := map[string]int{}
	for i, pool := range pools {
		p := fmt.Sprintf("%s[%d]", base, i)
		switch {
		case pool.Name == "":
			add(p+".name", "required")
		case !poolName.MatchString(pool.Name):
			add(p+".name", "%q: lower case letters, digits and '-', starting and ending with a letter or digit, at most 63", pool.Name)
		}
		if j, dup := names[pool.Name]; dup && pool.Name != "" {
			add(p+".name", "%q is also the name of %s[%d]", pool.Name, base, j)
		}
		names[pool.Name] = i
		if !oneOf(pool.Mode, "queue", "netdev") {
			add(p+".mode", "%q; allowed: %s", pool.Mode, allowedList("queue", "netdev"))
		}
		if pool.ServedBy != "" && !oneOf(pool.ServedBy, "dra", "devicePlugin") {
			add(p+".servedBy", "%q; allowed: %s", pool.ServedBy, allowedList("dra", "devicePlugin"))
		}
		if !oneOf(pool.Steering, "auto", "hardware", "software") {
			add(p+".steering", "%q; allowed: %s", pool.Steering, allowedList("auto", "hardware", "software"))
		}
		for j, dst := range pool.SharedDestinations {
			if _, err := flow.ParseDestination(dst); err != nil {
				add(fmt.Sprintf("%s.sharedDestinations[%d]", p, j), "%v", err)
			}
		}
		if !oneOf(pool.Attach, "onDemand", "always") {
			add(p+".attach", "%q; allowed: %s", pool.Attach, allowedList("onDemand", "always"))
		}
		d := pool.Devices
		if len(d.Netdevs)+len(d.Drivers)+len(d.Vendors)+len(d.DeviceIDs)+len(d.PCIAddresses) == 0 {
			add(p+".devices", "selects nothing: give netdevs, drivers, vendors, deviceIDs or pciAddresses")
		}
		allRanged := len(d.Netdevs) > 0
		for j, n := range d.Netdevs {
			_, qs, err := SplitNetdev(n)
			if err != nil {
				add(fmt.Sprintf("%s.devices.netdevs[%d]", p, j), "%v", err)
				continue
			}
			allRanged = allRanged && qs != nil
			if pool.Mode == "netdev" && qs != nil {
				add(fmt.Sprintf("%s.devices.netdevs[%d]", p, j), "a netdev-mode pool takes whole netdevs; no #queues")
			}
		}
		for j, v := range d.Drivers {
			if !driverName.MatchString(v) {
				add(fmt.Sprintf("%s.devices.drivers[%d]", p, j), "%q is not a driver name", v)
			}
		}
		for j, v := range d.Vendors {
			if !hexID.MatchString(v) {
				add(fmt.Sprintf("%s.devices.vendors[%d]", p, j), "%q: want 4 lower-case hex digits such as 8086", v)
			}
		}
		for j, v := range d.DeviceIDs {
			if !hexID.MatchString(v) {
				add(fmt.Sprintf("%s.devices.deviceIDs[%d]", p, j), "%q: want 4 lower-case hex digits such as 1592", v)
			}
		}
		for j, v := range d.PCIAddresses {
			if !pciAddress.MatchString(v) {
				add(fmt.Sprintf("%s.devices.pciAddresses[%d]", p, j), "%q: want domain:bus:device.function such as 0000:3b:00.0", v)
			}
		}
		switch {
		case pool.Mode == "netdev" && pool.Queues != "":
			add(p+".queues", "a netdev-mode pool takes whole netdevs; no queues")
		case pool.Queues != "":
			if _, err := ParseQueues(pool.Queues); err != nil {
				add(p+".queues", "%v", err)
			}
		case pool.Mode != "netdev" && !allRanged:
			add(p+".queues", "required: the queues to reserve on each netdev the pool selects (or a #range on every netdevs entry)")
		}
		l := pool.Limits
		if l.MaxUMEMBytes < 0 || (l.MaxUMEMBytes > 0 && l.MaxUMEMBytes < 4096) {
			add(p+".limits.maxUMEMBytes", "%d: at least 4096", l.MaxUMEMBytes)
		}
		if l.MaxRing != 0 && (l.MaxRing&(l.MaxRing-1) != 0 || l.MaxRing > 1<<20) {
			add(p+".limits.maxRing", "%d: a power of two up to %d", l.MaxRing, 1<<20)
		}
		if l.MaxQueuesPerPod < 0 {
			add(p+".limits.maxQueuesPerPod", "%d: not negative", l.MaxQueuesPerPod)
		}
		if pool.Linger.Duration < 0 {
			add(p+".linger", "%v: not negative", pool.Linger.Duration)
		}
		if dp := pool.DPDK; dp != nil {
			switch {
			case pool.Mode != "netdev":
				add(p+".dpdk", "for netdev-mode pools only: DPDK's af_xdp driver binds its own sockets on an interface in its own namespace, where a queue pool's netdev is not")
			case !ifName.MatchString(dp.Iface) || len(dp.Iface) > 15 || dp.Iface == "." || dp.Iface == "..":
				add(p+".dpdk.iface", "%q: an interface name of 1 to 15 characters, no '/', ':' or white space", dp.Iface)
			}
		}
		if b := pool.BusyPoll; b != nil {
			if b.TimeoutMicros < 1 || b.TimeoutMicros > 1_000_000 {
				add(p+".busyPoll.timeoutMicros", "%d: from 1 to 1000000", b.TimeoutMicros)
			}
			if b.Budget < 1 || b.Budget > 65535 {
				add(p+".busyPoll.budget", "%d: from 1 to 65535", b.Budget)
			}
		}
	}
}

// claims finds queues that two pools claim on a netdev they both name.
// Pools that select by driver or PCI id are checked against the real
// netdevs when the config is resolved.
func claims(pools []Pool, base string) []FieldError {
	type owner struct {
		pool, entry int
	}
	held := map[string]map[uint32]owner{}
	var errs []FieldError
	for i, pool := range pools {
		common, _ := ParseQueues(pool.Queues)
		for j, n := range pool.Devices.Netdevs {
			name, qs, err := SplitNetdev(n)
			if err != nil {
				continue
			}
			if qs == nil {
				qs = common
			}
			if pool.Mode == "netdev" {
				qs = []uint32{1 << 31} // the whole netdev
			}
			if held[name] == nil {
				held[name] = map[uint32]owner{}
			}
			for _, q := range qs {
				if o, ok := held[name][q]; ok && o.pool != i {
					what := fmt.Sprintf("queue %d of %s", q, name)
					if q == 1<<31 || pools[o.pool].Mode == "netdev" {
						what = "netdev " + name
					}
					errs = append(errs, FieldError{fmt.Sprintf("%s[%d].devices.netdevs[%d]", base, i, j),
						fmt.Sprintf("%s is claimed by pool %q too (%s[%d].devices.netdevs[%d])", what, pools[o.pool].Name, base, o.pool, o.entry)})
					break
				}
				held[name][q] = owner{i, j}
			}
			if pool.Mode != "netdev" {
				if _, whole := held[name][1<<31]; whole {
					errs = append(errs, FieldError{fmt.Sprintf("%s[%d].devices.netdevs[%d]", base, i, j),
						fmt.Sprintf("netdev %s is claimed whole by a netdev-mode pool", name)})
				}
			}
		}
	}
	return errs
}
