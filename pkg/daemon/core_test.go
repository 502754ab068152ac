package daemon

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// faceImports are the packages only the faces may use: Kubernetes, gRPC
// (kubelet's APIs) and xdpq's face packages. The core, which owns the
// allocations and attachments, uses none of them.
var faceImports = []string{"k8s.io/", "google.golang.org/grpc", "github.com/xdpq/xdpq/pkg/deviceplugin",
	"github.com/xdpq/xdpq/pkg/dra", "github.com/xdpq/xdpq/pkg/nri", "github.com/xdpq/xdpq/pkg/podflows",
	"github.com/xdpq/xdpq/pkg/nodestatus", "github.com/xdpq/xdpq/pkg/kubepods", "github.com/xdpq/xdpq/pkg/localapi", "github.com/xdpq/xdpq/internal/kube",
	"github.com/xdpq/xdpq/apis/"}

// faceTypes are the faces' types: the core names none of them.
var faceTypes = map[string]bool{"Daemon": true, "pluginsCore": true, "draCore": true, "localCore": true,
	"podFlowsCore": true, "nriCore": true, "ownAttachments": true, "metered": true, "daemonCollector": true}

// TestCoreCallsNoFace keeps the core below its faces: a file with the
// core's methods imports nothing of Kubernetes or of a face, and no core
// method names a face's type (it tells them of changes through
// subscribe alone).
func TestCoreCallsNoFace(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	parsed := map[string]*ast.File{}
	// The functions of files that import a face's package: the core
	// calls none of them either.
	faceFuncs := map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed[name] = f
		if faceImport(f) == "" {
			continue
		}
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil {
				faceFuncs[fd.Name.Name] = name
			}
		}
	}
	coreFiles := 0
	for name, f := range parsed {
		var methods []*ast.FuncDecl
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && receiverType(fd) == "core" {
				methods = append(methods, fd)
			}
		}
		if len(methods) == 0 {
			continue
		}
		coreFiles++
		if path := faceImport(f); path != "" {
			t.Errorf("%s has the core's methods and imports %s, a face's", name, path)
		}
		for _, fd := range methods {
			sels := map[*ast.Ident]bool{} // a field's, method's or package member's name: not this package's
			ast.Inspect(fd, func(n ast.Node) bool {
				if se, ok := n.(*ast.SelectorExpr); ok {
					sels[se.Sel] = true
				}
				return true
			})
			ast.Inspect(fd, func(n ast.Node) bool {
				id, ok := n.(*ast.Ident)
				switch {
				case !ok, sels[id]:
				case id.Obj != nil && id.Obj.Kind != ast.Typ && id.Obj.Kind != ast.Fun: // a local
				case faceTypes[id.Name]:
					t.Errorf("%s: core.%s names %s, a face's type", fset.Position(id.Pos()), fd.Name.Name, id.Name)
				case faceFuncs[id.Name] != "":
					t.Errorf("%s: core.%s calls %s, of %s, which imports a face's package", fset.Position(id.Pos()), fd.Name.Name, id.Name, faceFuncs[id.Name])
				}
				return true
			})
		}
	}
	if coreFiles < 5 {
		t.Fatalf("only %d files have the core's methods: the check looks at the wrong files", coreFiles)
	}
}

// faceImport is the first of f's imports that only a face may use, "" if none.
func faceImport(f *ast.File) string {
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		for _, face := range faceImports {
			if strings.HasPrefix(path, face) {
				return path
			}
		}
	}
	return ""
}

// receiverType is the name of fd's receiver type, "" for a function.
func receiverType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	typ := fd.Recv.List[0].Type
	if st, ok := typ.(*ast.StarExpr); ok {
		typ = st.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
