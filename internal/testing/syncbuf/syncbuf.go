// Package syncbuf is a buffer that goroutines may write while another
// reads it: a process's output, a logger's, collected for a test or a
// report.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer collects writes; its zero value is ready.
type Buffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
