package xdp_test

import (
	"os"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }
