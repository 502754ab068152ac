package image

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// The Dockerfile subset the repository's Dockerfile is written in, read
// the way `docker build` reads it, so that the test compares the image
// Docker would build with the one Build makes. Anything outside the
// subset is an error, never skipped.

// stage is a build stage: its name and its instructions, with variables
// expanded.
type stage struct {
	name   string
	copies []copyInstr
	runs   [][]string // each RUN's words (shell quoting removed)
	env    []string   // KEY=value, a key set again replaced in place
	labels map[string]string
	entry  []string
	user   string
	wd     string
}

type copyInstr struct {
	from, dest string
	srcs       []string
}

// parseDockerfile reads the Dockerfile at path with the build arguments
// args (Docker's --build-arg, and the TARGETARCH it sets).
func parseDockerfile(path string, args map[string]string) ([]*stage, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	global := map[string]string{} // ARGs before the first FROM
	var stages []*stage
	var cur *stage
	var vars map[string]string // the current stage's ARGs and ENVs
	for _, line := range logicalLines(string(data)) {
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		instr = strings.ToUpper(instr)
		if cur == nil && instr != "ARG" && instr != "FROM" {
			return nil, fmt.Errorf("%s before FROM", instr)
		}
		expand := func(s string) string { return expandVars(s, vars) }
		switch instr {
		case "ARG":
			name, def, hasDef := strings.Cut(rest, "=")
			scope := global
			if cur != nil {
				scope = vars
			}
			switch v, given := args[name]; {
			case given:
				scope[name] = v
			case cur != nil && global[name] != "" && !hasDef:
				scope[name] = global[name] // a global ARG redeclared in a stage
			case hasDef:
				scope[name] = expandVars(def, scope)
			default:
				scope[name] = ""
			}
		case "FROM":
			words := strings.Fields(rest)
			for len(words) > 0 && strings.HasPrefix(words[0], "--") {
				words = words[1:]
			}
			cur = &stage{labels: map[string]string{}}
			switch {
			case len(words) == 3 && strings.EqualFold(words[1], "AS"):
				cur.name = words[2]
			case len(words) != 1:
				return nil, fmt.Errorf("FROM %s: want IMAGE [AS NAME]", rest)
			}
			stages = append(stages, cur)
			vars = map[string]string{}
		case "COPY":
			words := strings.Fields(expand(rest))
			c := copyInstr{}
			for len(words) > 0 && strings.HasPrefix(words[0], "--") {
				flag, value, _ := strings.Cut(words[0], "=")
				if flag != "--from" {
					return nil, fmt.Errorf("COPY %s: flag %s not understood here", rest, flag)
				}
				c.from, words = value, words[1:]
			}
			if len(words) < 2 {
				return nil, fmt.Errorf("COPY %s: want sources and a destination", rest)
			}
			c.srcs, c.dest = words[:len(words)-1], words[len(words)-1]
			cur.copies = append(cur.copies, c)
		case "RUN":
			words, err := shellWords(expand(rest))
			if err != nil {
				return nil, fmt.Errorf("RUN %s: %w", rest, err)
			}
			cur.runs = append(cur.runs, words)
		case "ENV", "LABEL":
			pairs, err := keyValues(rest)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", instr, rest, err)
			}
			for _, kv := range pairs {
				k, v := kv[0], expand(kv[1])
				if instr == "LABEL" {
					cur.labels[k] = v
					continue
				}
				vars[k] = v
				i := -1
				for j, e := range cur.env {
					if strings.HasPrefix(e, k+"=") {
						i = j
					}
				}
				if i >= 0 {
					cur.env[i] = k + "=" + v
				} else {
					cur.env = append(cur.env, k+"="+v)
				}
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &cur.entry); err != nil {
				return nil, fmt.Errorf("ENTRYPOINT %s: only the exec (JSON) form runs in an image without a shell: %w", rest, err)
			}
		case "USER":
			cur.user = expand(rest)
		case "WORKDIR":
			cur.wd = expand(rest)
		default:
			return nil, fmt.Errorf("instruction %s not understood here", instr)
		}
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("no FROM")
	}
	return stages, nil
}

// logicalLines joins continued lines and drops comments and blank lines.
func logicalLines(s string) []string {
	var out []string
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") || (t == "" && b.Len() == 0) {
			continue
		}
		if cont, ok := strings.CutSuffix(t, "\\"); ok {
			b.WriteString(cont)
			b.WriteString(" ")
			continue
		}
		b.WriteString(t)
		if line := strings.TrimSpace(b.String()); line != "" {
			out = append(out, line)
		}
		b.Reset()
	}
	return out
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

func expandVars(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		return vars[name]
	})
}

// keyValues splits `k1=v1 k2="v 2"` into pairs.
func keyValues(s string) ([][2]string, error) {
	words, err := shellWords(s)
	if err != nil {
		return nil, err
	}
	var out [][2]string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=value", w)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// shellWords splits s into words as a POSIX shell would, for the quoting
// the Dockerfile uses: single and double quotes, backslash escapes.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unclosed ' in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				w.WriteByte(s[i])
			}
			if i == len(s) {
				return nil, fmt.Errorf("unclosed \" in %q", s)
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case c == '&' || c == '|' || c == ';':
			return nil, fmt.Errorf("%q: one command per RUN here", s)
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}
