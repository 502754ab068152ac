package broker_test

const podEnv = "XDPQ_BROKER_TEST_POD"

func podMain(string) int { return 0 }
