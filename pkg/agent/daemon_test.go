package agent_test

const daemonEnv = "XDPQ_AGENT_TEST_DAEMON"

func daemonMain() int { return 0 }
