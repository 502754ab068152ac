package ethtool

import (
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

func newVeth(t *testing.T) string {
	return testnet.NewPair(t, 4).NSPath()
}
