// Package errstyle holds a test of the module's error messages: each is a
// lowercase operation that a caller can wrap ("manage ens1f0: attach: ..."),
// never a package name that stutters once the caller adds its own context
// ("agent: agent: ...").
package errstyle

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the module's directory, seen from this package's.
const root = "../../.."

// TestNoPackagePrefix fails for every message given to fmt.Errorf or
// errors.New in the module's non-test code that begins with the name of one
// of the module's packages.
func TestNoPackagePrefix(t *testing.T) {
	files, names := moduleFiles(t)
	for _, n := range []string{"agent", "ledger", "daemon", "xdpq"} {
		if !names[n] {
			t.Fatalf("%q is not among the package names found under %s (%d files): %v", n, root, len(files), slices.Sorted(maps.Keys(names)))
		}
	}
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range prefixed(fset, f, names) {
			rel, err := filepath.Rel(root, p.Filename)
			if err != nil {
				rel = p.Filename
			}
			t.Errorf("%s:%d: the message begins with a package name; say the operation instead", rel, p.Line)
		}
	}
}

// TestPrefixed shows the check finds what TestNoPackagePrefix looks for,
// so that its passing means something.
func TestPrefixed(t *testing.T) {
	const src = `package p

import (
	"errors"
	"fmt"
	xerrors "errors"
)

var ErrX = errors.New("ledger: no record")                 // line 9
var errY = errors.New("no record")

func f(err error) error {
	_ = fmt.Errorf("agent: %s: %w", "eth1", err)           // line 13
	_ = fmt.Errorf("manage %s: %w", "eth1", err)
	_ = fmt.Errorf("rxnfc: %d bytes", 3)
	_ = xerrors.New("broker: " + "closed")                 // line 16
	_ = fmt.Sprintf("agent: %v", err)
	_ = fmt.Errorf("%s: agent: %w", "x", err)
	return fmt.Errorf("Agent: %w", err)
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"agent": true, "ledger": true, "broker": true}
	var lines []int
	for _, p := range prefixed(fset, f, names) {
		lines = append(lines, p.Line)
	}
	if want := []int{9, 13, 16}; !slices.Equal(lines, want) {
		t.Errorf("found messages on lines %v, want %v", lines, want)
	}
}

// moduleFiles walks the module (not the modules nested in it, such as
// test/e2e) and returns its non-test Go files and the names of its
// packages: the directories under pkg, cmd and internal (so pkg/apis/xdpq
// gives the module's own name) and every name a package clause declares.
func moduleFiles(t *testing.T) (files []string, names map[string]bool) {
	t.Helper()
	names = map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			base := d.Name()
			if base == "testdata" || base == "vendor" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			if top, _, _ := strings.Cut(rel, "/"); rel != top && (top == "pkg" || top == "cmd" || top == "internal") {
				names[base] = true
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		if f.Name.Name != "main" {
			names[f.Name.Name] = true
		}
		files = append(files, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, names
}

// leading is what a message begins with if it begins with a name and a
// colon.
var leading = regexp.MustCompile(`^([A-Za-z0-9_.-]+): `)

// prefixed returns where, in f, a literal message given to fmt.Errorf or
// errors.New begins with one of names.
func prefixed(fset *token.FileSet, f *ast.File, names map[string]bool) []token.Position {
	// The file's names for the packages it imports, which an import may
	// rename.
	imported := map[string]string{}
	for _, im := range f.Imports {
		path, err := strconv.Unquote(im.Path.Value)
		if err != nil {
			continue
		}
		name := path
		if im.Name != nil {
			name = im.Name.Name
		}
		imported[name] = path
	}
	var found []token.Position
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		switch imported[pkg.Name] + "." + sel.Sel.Name {
		case "fmt.Errorf", "errors.New":
		default:
			return true
		}
		arg := call.Args[0]
		// The first operand of a concatenation begins the message.
		for {
			b, ok := arg.(*ast.BinaryExpr)
			if !ok || b.Op != token.ADD {
				break
			}
			arg = b.X
		}
		lit, ok := arg.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		msg, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		if m := leading.FindStringSubmatch(msg); m != nil && names[m[1]] {
			found = append(found, fset.Position(lit.Pos()))
		}
		return true
	})
	return found
}
