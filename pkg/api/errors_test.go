package api

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestCodeOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("disk on fire"), CodeInternal},
		{Errorf(ErrNotFound, "no pool %q", "x"), CodeNotFound},
		{fmt.Errorf("pool x: %w", ErrConflict), CodeConflict},
		{fmt.Errorf("detach: %w", Errorf(ErrInvalid, "bad")), CodeInvalid},
		{ErrNotSupported, CodeNotSupported},
		{fmt.Errorf("kubelet: %w", context.DeadlineExceeded), CodeUnavailable},
	} {
		if got := CodeOf(c.err); got != c.want {
			t.Errorf("CodeOf(%v) = %q, want %q", c.err, got, c.want)
		}
		want := c.want
		if c.err == nil {
			want = "success"
		}
		if got := ResultOf(c.err); got != want {
			t.Errorf("ResultOf(%v) = %q, want %q", c.err, got, want)
		}
	}
}
