// Package docscheck holds no code: its tests keep the docs (README.md and
// docs/) true to the code. They fail when the metrics reference, the
// troubleshooting guide or the configuration reference misses what the
// code defines, when a relative link leads nowhere, when a command shown
// in the docs does not say what runs it, and when the README's first
// link into docs/ is not on its first screen.
package docscheck
