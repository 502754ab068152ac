package dra

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// removeSpecsExcept removes the claim CDI specs in dir whose claim UID
// is not in keep.
func removeSpecsExcept(dir string, keep map[string]bool) error {
	prefix := strings.TrimSuffix(specName("X"), "X.json")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		uid, ok := strings.CutPrefix(e.Name(), prefix)
		uid, json := strings.CutSuffix(uid, ".json")
		if !ok || !json || keep[uid] {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
