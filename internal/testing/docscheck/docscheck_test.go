package docscheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/dra"
)

// root is the repository's root, from this package's directory.
const root = "../../.."

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// --- (a) the metrics reference lists exactly the code's families

var metricDef = regexp.MustCompile(`(?:prometheus\.NewDesc\(\s*|Name:\s*)"(xdpq_[a-z0-9_]+)"`)

// codeMetrics are the xdpq_ families pkg/ defines (prometheus.NewDesc and
// the Name of an Opts), from the source.
func codeMetrics(t *testing.T) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(filepath.Join(root, "pkg"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricDef.FindAllStringSubmatch(string(b), -1) {
			names = append(names, m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

var metricHeading = regexp.MustCompile("(?m)^### `(xdpq_[a-z0-9_]+)`\\s*$")

// metricsDiff says which of names the reference has no heading for, and
// which headings name no family of the code.
func metricsDiff(doc string, names []string) (missing, extra []string) {
	documented := map[string]bool{}
	for _, m := range metricHeading.FindAllStringSubmatch(doc, -1) {
		documented[m[1]] = true
	}
	for _, n := range names {
		if !documented[n] {
			missing = append(missing, n)
		}
		delete(documented, n)
	}
	for n := range documented {
		extra = append(extra, n)
	}
	slices.Sort(extra)
	return missing, extra
}

func TestMetricsReference(t *testing.T) {
	names := codeMetrics(t)
	if len(names) < 20 {
		t.Fatalf("found %d xdpq_ families in pkg/, fewer than the code has: is the pattern stale? %v", len(names), names)
	}
	missing, extra := metricsDiff(read(t, "docs/metrics.md"), names)
	for _, n := range missing {
		t.Errorf("docs/metrics.md has no \"### `%s`\": the code defines it", n)
	}
	for _, n := range extra {
		t.Errorf("docs/metrics.md documents %s, which no code in pkg/ defines", n)
	}
}

// --- (b) the troubleshooting guide names every state, reason and code

// consts returns the string constants of file whose names start with
// one of prefixes.
func consts(t *testing.T, file string, prefixes ...string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, file), nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) || !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name.Name, p) }) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, s)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no string constant named %v...: is the source list stale?", file, prefixes)
	}
	return out
}

var draReason = regexp.MustCompile(`(?m)x\.Unavailable, x\.Reason = .*, "([A-Za-z]+)"$`)

// userStrings are the states, reasons and codes a user meets, by where
// the code defines them.
func userStrings(t *testing.T) map[string][]string {
	t.Helper()
	dr := draReason.FindAllStringSubmatch(read(t, "pkg/dra/face.go"), -1)
	if len(dr) == 0 {
		t.Fatal("pkg/dra/face.go: no device reason found: is the pattern stale?")
	}
	var draReasons []string
	for _, m := range dr {
		draReasons = append(draReasons, m[1])
	}
	return map[string][]string{
		"XdpqNode netdev states (pkg/apis/xdpq/v1alpha1)":  consts(t, "pkg/apis/xdpq/v1alpha1/types.go", "State"),
		"XdpqNode conditions (pkg/apis/xdpq/v1alpha1)":     consts(t, "pkg/apis/xdpq/v1alpha1/types.go", "Condition"),
		"condition reasons (pkg/nodestatus)":               consts(t, "pkg/nodestatus/convert.go", "Reason"),
		"Event reasons (pkg/nodestatus)":                   consts(t, "pkg/nodestatus/events.go", "Event"),
		"agent states, metrics and xdpqctl (pkg/agent)":    consts(t, "pkg/agent/agent.go", "State"),
		"broker refusal codes (pkg/wire)":                  consts(t, "pkg/wire/wire.go", "Code"),
		"local API error codes (pkg/api)":                  consts(t, "pkg/api/errors.go", "Code"),
		"DRA device condition (pkg/dra)":                   {dra.ConditionReady},
		"DRA taint key (pkg/dra)":                          {dra.TaintKey},
		"DRA device reasons and taint values (pkg/daemon)": draReasons,
	}
}

// notNamed are the strings of want that doc does not have in backquotes.
func notNamed(doc string, want []string) []string {
	var out []string
	for _, w := range want {
		if !strings.Contains(doc, "`"+w+"`") && !strings.Contains(doc, "`"+w+"=") {
			out = append(out, w)
		}
	}
	return out
}

func TestTroubleshootingNamesEveryState(t *testing.T) {
	doc := read(t, "docs/troubleshooting.md")
	for what, want := range userStrings(t) {
		for _, s := range notNamed(doc, want) {
			t.Errorf("docs/troubleshooting.md does not name `%s`, one of the %s: say what it means and what to do", s, what)
		}
	}
}

// --- (c) the configuration reference names every field of the schema

// schemaFields are the field paths of a JSON schema: pools, pools[].name,
// pools[].limits.maxRing... An array whose items have the schema of
// pools' items is not descended again (nodes[].pools).
func schemaFields(schema map[string]any) []string {
	var pools any
	if p, ok := schema["properties"].(map[string]any)["pools"].(map[string]any); ok {
		pools = p["items"]
	}
	var out []string
	var walk func(prefix string, s map[string]any)
	walk = func(prefix string, s map[string]any) {
		props, _ := s["properties"].(map[string]any)
		for name, v := range props {
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			out = append(out, p)
			ps, _ := v.(map[string]any)
			if items, ok := ps["items"].(map[string]any); ok {
				if p != "pools" && reflect.DeepEqual(any(items), pools) {
					continue
				}
				walk(p+"[]", items)
			} else {
				walk(p, ps)
			}
		}
	}
	walk("", schema)
	slices.Sort(out)
	return out
}

func TestConfigReferenceNamesEveryField(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal([]byte(read(t, "docs/config.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	fields := schemaFields(schema)
	if !slices.Contains(fields, "pools[].limits.maxRing") || !slices.Contains(fields, "nodes[].pools") {
		t.Fatalf("the schema's fields as walked: %v: is the walk stale?", fields)
	}
	for _, f := range notNamed(read(t, "docs/configuration.md"), fields) {
		t.Errorf("docs/configuration.md does not name `%s`, a field of docs/config.schema.json", f)
	}
}

// --- (d) every relative link resolves

// markdownFiles are README.md and every .md under docs/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	inlineCode = regexp.MustCompile("`[^`]*`")
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	notSlug    = regexp.MustCompile(`[^\p{L}\p{N}\s_-]`)
)

// prose calls fn with each line of doc outside fenced code blocks, and
// its number.
func prose(doc string, fn func(n int, line string)) {
	fence := false
	sc := bufio.NewScanner(strings.NewReader(doc))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if !fence {
			fn(n, line)
		}
	}
}

// anchors are the ids GitHub gives doc's headings.
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	prose(doc, func(_ int, line string) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			return
		}
		s := strings.ToLower(strings.ReplaceAll(m[1], "`", ""))
		s = strings.ReplaceAll(notSlug.ReplaceAllString(s, ""), " ", "-")
		if k := seen[s]; k > 0 {
			out[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	})
	return out
}

// brokenLinks are the relative links of file (its text doc) whose file,
// or anchor in a markdown file, does not exist.
func brokenLinks(file, doc string, readFile func(string) (string, error)) []string {
	var out []string
	prose(doc, func(n int, line string) {
		for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			full := file
			if path != "" {
				full = filepath.Join(filepath.Dir(file), path)
			}
			text, err := readFile(full)
			if err != nil {
				out = append(out, fmt.Sprintf("%s:%d: %s: %v", file, n, target, err))
				continue
			}
			if anchor != "" && strings.HasSuffix(full, ".md") && !anchors(text)[anchor] {
				out = append(out, fmt.Sprintf("%s:%d: %s: no heading of %s has the anchor #%s", file, n, target, full, anchor))
			}
		}
	})
	return out
}

func readRepo(path string) (string, error) {
	full := filepath.Join(root, path)
	st, err := os.Stat(full)
	if err != nil || st.IsDir() {
		return "", err
	}
	b, err := os.ReadFile(full)
	return string(b), err
}

func TestLinksResolve(t *testing.T) {
	for _, f := range markdownFiles(t) {
		for _, b := range brokenLinks(f, read(t, f), readRepo) {
			t.Error(b)
		}
	}
}

// --- (e) the README's first link into docs/ is on its first screen

// firstScreen is how many lines of the README may come before its first
// link into docs/.
const firstScreen = 80

// firstDocsLink is the line of doc's first link into docs/, 0 for none.
func firstDocsLink(doc string) int {
	first := 0
	prose(doc, func(n int, line string) {
		if first == 0 && strings.Contains(line, "](docs/") {
			first = n
		}
	})
	return first
}

func TestReadmeFirstScreen(t *testing.T) {
	n := firstDocsLink(read(t, "README.md"))
	switch {
	case n == 0:
		t.Error("README.md has no link into docs/: its first screen must say where to go next")
	case n > firstScreen:
		t.Errorf("README.md's first link into docs/ is on line %d; it must come within the first %d", n, firstScreen)
	}
}

// --- every command shown says what runs it

var runComment = regexp.MustCompile(`#.*\b(run|runs|test|tests)\b`)

// silentCommands are the lines of doc's shell blocks (```sh, and "$ "
// lines of plain blocks) that carry no comment saying what runs them.
func silentCommands(file, doc string) []string {
	var out []string
	lang, fence, cont := "", false, false
	sc := bufio.NewScanner(strings.NewReader(doc))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			fence, lang, cont = !fence, strings.TrimPrefix(trimmed, "```"), false
			continue
		}
		if !fence {
			continue
		}
		var cmd bool
		switch lang {
		case "sh", "bash", "shell":
			cmd = trimmed != "" && !strings.HasPrefix(trimmed, "#") && !cont
		case "":
			cmd = strings.HasPrefix(trimmed, "$ ")
		}
		cont = strings.HasSuffix(trimmed, `\`)
		if cmd && !runComment.MatchString(line) {
			out = append(out, fmt.Sprintf("%s:%d: %s", file, n, trimmed))
		}
	}
	return out
}

func TestCommandsSayWhatRunsThem(t *testing.T) {
	for _, f := range markdownFiles(t) {
		for _, c := range silentCommands(f, read(t, f)) {
			t.Errorf("%s: say in a comment what runs it (# run by make demo, # make e2e (TestScenario) runs it, # not run by a test: why)", c)
		}
	}
}

// --- the checks catch what they are for

func TestChecksFailOnBrokenDocs(t *testing.T) {
	if m, x := metricsDiff("### `xdpq_a_total`\n### `xdpq_c`\n", []string{"xdpq_a_total", "xdpq_b"}); !slices.Equal(m, []string{"xdpq_b"}) || !slices.Equal(x, []string{"xdpq_c"}) {
		t.Errorf("metricsDiff: missing %v, extra %v; want [xdpq_b], [xdpq_c]", m, x)
	}
	if got := notNamed("`Direct` and Filter", []string{"Direct", "Filter"}); !slices.Equal(got, []string{"Filter"}) {
		t.Errorf("notNamed = %v, want [Filter]", got)
	}
	files := map[string]string{"docs/a.md": "# A title\n## Why `x`?\n", "docs/b.md": ""}
	readFake := func(p string) (string, error) {
		if s, ok := files[p]; ok {
			return s, nil
		}
		return "", os.ErrNotExist
	}
	doc := "[ok](a.md#why-x) [gone](c.md) [bad](a.md#nope) [self](#a-title)\n```\n[in code](nowhere.md)\n```\n"
	if got := brokenLinks("docs/b.md", doc, readFake); len(got) != 3 {
		t.Errorf("brokenLinks found %d broken (%v), want 3: c.md, a.md#nope, #a-title in b.md", len(got), got)
	}
	if n := firstDocsLink(strings.Repeat("line\n", 90) + "[x](docs/x.md)\n"); n != 91 {
		t.Errorf("firstDocsLink = %d, want 91", n)
	}
	sh := "```sh\nmake demo   # run by hand\nmake test\nfoo \\\n  --bar\n```\n```\n$ kubectl get x\n```\n"
	if got := silentCommands("x.md", sh); len(got) != 3 {
		t.Errorf("silentCommands = %v, want make test, foo and $ kubectl get x", got)
	}
	if got := schemaFields(map[string]any{"properties": map[string]any{
		"pools": map[string]any{"items": map[string]any{"properties": map[string]any{"name": map[string]any{}}}},
		"nodes": map[string]any{"items": map[string]any{"properties": map[string]any{
			"pools": map[string]any{"items": map[string]any{"properties": map[string]any{"name": map[string]any{}}}}}}},
	}}); !slices.Equal(got, []string{"nodes", "nodes[].pools", "pools", "pools[].name"}) {
		t.Errorf("schemaFields = %v", got)
	}
}
