package bench

import (
	"strings"
	"testing"
)

func TestParseCPUInfo(t *testing.T) {
	const info = `processor	: 0
vendor_id	: AuthenticAMD
model name	: AMD EPYC 9654 96-Core Processor
cpu MHz		: 2396.400
flags		: fpu vme

processor	: 1
model name	: AMD EPYC 9654 96-Core Processor
cpu MHz		: 3700.000
`
	m := parseCPUInfo(strings.NewReader(info))
	if m.CPU != "AMD EPYC 9654 96-Core Processor" || m.MHz != "2396.400" || m.Cores != 2 {
		t.Errorf("parsed %+v", m)
	}
	m.Kernel, m.LoadAvg = "6.18.0", "0.10 0.20 0.30"
	if got, want := m.String(), "machine: AMD EPYC 9654 96-Core Processor at 2396.400 MHz, 2 cores, kernel 6.18.0, load average 0.10 0.20 0.30 at the start"; got != want {
		t.Errorf("line %q\nwant %q", got, want)
	}
}

func TestReadMachine(t *testing.T) {
	m, err := ReadMachine()
	if err != nil {
		t.Fatal(err)
	}
	if m.Cores < 1 || m.Kernel == "" || len(strings.Fields(m.LoadAvg)) != 3 {
		t.Errorf("this machine read as %+v", m)
	}
}

// TestRatioWithinRounds: a VM that speeds up between a ceiling's and a
// receiver's runs of one round (XDP_DROP at 1.43 Mpps in rounds 1 and 2,
// the receiver already at the faster speed in round 2, both fast in
// round 3): the medians' ratio puts the receiver above its ceiling
// (2.20/1.43 = 1.54), the median of each round's ratio does not (0.98).
// Rounds missing on one side fall back to the medians' ratio.
func TestRatioWithinRounds(t *testing.T) {
	ceiling := []float64{1.43e6, 1.43e6, 2.28e6}
	receiver := []float64{1.40e6, 2.20e6, 2.20e6}
	if naive := Median(receiver) / Median(ceiling); naive < 1.5 {
		t.Fatalf("the case: medians' ratio %.2f, want above 1.5", naive)
	}
	for _, c := range []struct {
		name string
		x, y []float64
		want float64
	}{
		{"speed change", receiver, ceiling, 1.40 / 1.43},
		{"steady", []float64{1, 2, 3}, []float64{2, 4, 6}, 0.5},
		{"rounds missing", []float64{1, 2, 3}, []float64{4}, 0.5},
		{"a zero round", []float64{1, 2, 3}, []float64{0, 4, 6}, 0.5},
		{"nothing", nil, nil, 0},
	} {
		if got := Ratio(c.x, c.y); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("%s: Ratio %v / %v = %.4f, want %.4f", c.name, c.x, c.y, got, c.want)
		}
	}
}
