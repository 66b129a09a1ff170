package main

import (
	"encoding/json"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTablesSayYesOrNo: no command prints a bool as true or false. The
// CLI's source is type-checked, and every fmt call that is given a bool,
// or a %t verb, is refused: tables say yes or no (yesNo). JSON output
// (-o json) keeps its booleans; it is written by encoding/json.
func TestTablesSayYesOrNo(t *testing.T) {
	t.Parallel()
	pkgs := exportData(t, ".")
	var files []string
	for _, f := range pkgs["."].GoFiles {
		files = append(files, filepath.Join(pkgs["."].Dir, f))
	}
	if len(files) < 5 {
		t.Fatalf("found %d source files of the CLI", len(files))
	}
	for _, bad := range boolPrints(t, pkgs, files) {
		t.Errorf("%s: prints a bool as true/false; use yesNo", bad)
	}
}

// TestBoolPrintsAreFound: the check of TestTablesSayYesOrNo finds each way
// a bool reaches a table, and lets yesNo and strings through.
func TestBoolPrintsAreFound(t *testing.T) {
	t.Parallel()
	pkgs := exportData(t, ".")
	src := `package main

import (
	"fmt"
	"io"
)

type box struct {
	Online bool
	Name   string
}

type flag bool

func yesNo(b bool) string { return map[bool]string{true: "yes"}[b] }

func table(w io.Writer, b box, f flag) string {
	fmt.Fprintf(w, "%s\t%v\n", b.Name, b.Online) // bad: line 18
	fmt.Fprintln(w, b.Name, b.Online)            // bad: line 19
	fmt.Fprintf(w, "%t\n", yesNo(b.Online) == "")  // bad: line 20, %t
	_ = fmt.Sprint(f)                            // bad: line 21, a named bool
	fmt.Fprintf(w, "%s\t%s\n", b.Name, yesNo(b.Online))
	fmt.Fprintf(w, "%d%%\n", 5)
	return fmt.Sprintf("%s", yesNo(!b.Online))
}
`
	file := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, bad := range boolPrints(t, pkgs, []string{file}) {
		lines = append(lines, bad[strings.LastIndex(bad[:strings.LastIndex(bad, ":")], ":")+1:strings.LastIndex(bad, ":")])
	}
	if got := strings.Join(lines, ","); got != "18,19,20,21" {
		t.Fatalf("found bool prints on lines %q, want 18,19,20,21", got)
	}
}

type listedPackage struct {
	ImportPath, Dir, Export string
	GoFiles                 []string
}

// exportData lists the package in dir and everything it imports, with the
// compiler's export data of each ("." is the package itself).
func exportData(t *testing.T, dir string) map[string]listedPackage {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(goTool, "list", "-export", "-deps", "-json", dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]listedPackage{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var last listedPackage
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
		last = p
	}
	pkgs["."] = last // -deps lists the package itself last
	return pkgs
}

// boolPrints type-checks files and returns "file:line:col" of every fmt
// call given a bool argument or a %t verb.
func boolPrints(t *testing.T, pkgs map[string]listedPackage, files []string) []string {
	t.Helper()
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, af)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p, ok := pkgs[path]
		if !ok || p.Export == "" {
			return nil, os.ErrNotExist
		}
		return os.Open(p.Export)
	})
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}
	if _, err := (&types.Config{Importer: imp}).Check("main", fset, parsed, info); err != nil {
		t.Fatalf("type-checking the CLI: %v", err)
	}
	var bad []string
	for _, af := range parsed {
		ast.Inspect(af, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			fn, ok := info.Uses[sel.Sel].(*types.Func)
			if !ok || fn.Pkg() == nil || fn.Pkg().Path() != "fmt" {
				return true
			}
			for _, arg := range call.Args {
				tv := info.Types[arg]
				if tv.Type == nil {
					continue
				}
				if b, ok := tv.Type.Underlying().(*types.Basic); ok && b.Info()&types.IsBoolean != 0 {
					bad = append(bad, fset.Position(arg.Pos()).String())
					return true
				}
				if tv.Value != nil && tv.Value.Kind() == constant.String && hasVerbT(constant.StringVal(tv.Value)) {
					bad = append(bad, fset.Position(arg.Pos()).String())
					return true
				}
			}
			return true
		})
	}
	return bad
}

// hasVerbT reports whether a format string holds a %t verb (with any
// flags or width).
func hasVerbT(format string) bool {
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		j := i + 1
		for j < len(format) && strings.IndexByte("+-# 0123456789.*[]", format[j]) >= 0 {
			j++
		}
		if j < len(format) && format[j] == 't' {
			return true
		}
		i = j
	}
	return false
}
