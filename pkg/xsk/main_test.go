package xsk_test

import (
	"os"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	os.Exit(testnet.MainWithLeakCheck(m))
}
