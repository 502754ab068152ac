package nodestatus

import "time"

// SetWaiting has w call f each time Run waits, with when it looks next:
// a test steps its fake clock once the loop waits.
func SetWaiting(w *Writer, f func(due time.Time)) { w.waiting = f }

// Urgent is urgent, for tests.
var Urgent = urgent
