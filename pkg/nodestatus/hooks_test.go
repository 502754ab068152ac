package nodestatus_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/xdpq/xdpq/pkg/nodestatus"
)

type toldEvents []string

func (e *toldEvents) NetdevOverridden(netdev, program string, id uint32) {
	*e = append(*e, fmt.Sprintf("overridden %s %s %d", netdev, program, id))
}

func (e *toldEvents) NetdevReclaimed(netdev, state string) {
	*e = append(*e, fmt.Sprintf("reclaimed %s %s", netdev, state))
}

// TestHooks is each hook transition across a run of reports: a foreign
// program taking the hook over is told once (again when another foreign
// program replaces it), xdpq's return once, as Idle when no program is
// needed; a netdev that goes away while overridden has not come back,
// and the first report of a netdev tells only an override.
func TestHooks(t *testing.T) {
	hook := func(netdev, state string, program uint32, foreign string) nodestatus.Hook {
		return nodestatus.Hook{Netdev: netdev, State: state, Program: program, Foreign: foreign}
	}
	var hooks nodestatus.Hooks
	for _, step := range []struct {
		name  string
		hooks []nodestatus.Hook
		want  []string
	}{
		{"first report", []nodestatus.Hook{hook("eth1", "Direct", 7, ""), hook("eth2", "Overridden", 9, "fw")},
			[]string{"overridden eth2 fw 9"}},
		{"nothing changed", []nodestatus.Hook{hook("eth1", "Direct", 7, ""), hook("eth2", "Overridden", 9, "fw")}, nil},
		{"eth1 taken over", []nodestatus.Hook{hook("eth1", "Overridden", 11, "lb"), hook("eth2", "Overridden", 9, "fw")},
			[]string{"overridden eth1 lb 11"}},
		{"eth2's foreign program replaced", []nodestatus.Hook{hook("eth1", "Overridden", 11, "lb"), hook("eth2", "Overridden", 12, "fw2")},
			[]string{"overridden eth2 fw2 12"}},
		{"eth1 back, no socket bound", []nodestatus.Hook{hook("eth1", "None", 0, ""), hook("eth2", "Overridden", 12, "fw2")},
			[]string{"reclaimed eth1 Idle"}},
		{"eth2 gone", []nodestatus.Hook{hook("eth1", "Filter", 13, ""), hook("eth2", "Missing", 0, "")}, nil},
		{"eth2 again, its program back", []nodestatus.Hook{hook("eth1", "Filter", 13, ""), hook("eth2", "Direct", 14, "")}, nil},
		{"eth1 taken, then back between reports", []nodestatus.Hook{hook("eth1", "Overridden", 15, "x"), hook("eth2", "Direct", 14, "")},
			[]string{"overridden eth1 x 15"}},
		{"eth1 back with the filter", []nodestatus.Hook{hook("eth1", "Filter", 16, ""), hook("eth2", "Direct", 14, "")},
			[]string{"reclaimed eth1 Filter"}},
	} {
		var h toldEvents
		hooks.Observe(step.hooks, &h)
		if !slices.Equal(h, step.want) {
			t.Errorf("%s: told %q, want %q", step.name, h, step.want)
		}
	}
}
