package client

// CloseReceiver is what Lease.Close does to a Receiver before it unmaps
// the rings: it ends the Receiver's waits.
var CloseReceiver = (*Receiver).close
