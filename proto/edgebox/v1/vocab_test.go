package edgeboxv1

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// vocabulary returns the string constants vocab.go defines, by value,
// each with its name. Parsing the file, rather than listing them here,
// keeps a word added there covered by the tests below.
func vocabulary(t *testing.T) map[string][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "vocab.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	words := map[string][]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("vocab.go: %s is not a string literal", vs.Names[i].Name)
				}
				val, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				words[val] = append(words[val], vs.Names[i].Name)
			}
		}
	}
	if len(words) < 30 {
		t.Fatalf("vocab.go holds %d words; the parse missed some", len(words))
	}
	return words
}

// notTheWord holds the literals (file, value) that spell a word of the
// vocabulary with another meaning.
var notTheWord = map[[2]string]bool{
	// The QEMU executable's name, by which the driver tells a VM process.
	{"agent/runtime/qemu/qemu_windows.go", "qemu"}: true,
}

// TestVocabularyIsTheOnlySpelling fails when code in agent/ or console/
// spells one of the contract's words as a literal of its own instead of
// using the constant: a literal drifts the day the word changes on one
// side only. Tests may spell the words: they check what the wire carries.
func TestVocabularyIsTheOnlySpelling(t *testing.T) {
	t.Parallel()
	words := vocabulary(t)
	root := filepath.Join("..", "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found from proto/edgebox/v1: %v", err)
	}
	scanned := 0
	excused := map[[2]string]bool{}
	for _, dir := range []string{"agent", "console"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			scanned++
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			for _, lit := range literalsIn(f) {
				val, _ := strconv.Unquote(lit.Value)
				if notTheWord[[2]string{rel, val}] {
					excused[[2]string{rel, val}] = true
					continue
				}
				if names, ok := words[val]; ok {
					t.Errorf("%s:%d: literal %s: use edgeboxv1.%s", rel, fset.Position(lit.Pos()).Line, lit.Value, strings.Join(names, " or edgeboxv1."))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if scanned < 50 {
		t.Fatalf("scanned %d files of agent/ and console/; the walk missed them", scanned)
	}
	for e := range notTheWord {
		if !excused[e] {
			t.Errorf("notTheWord holds %s %q, which no longer occurs there: drop it", e[0], e[1])
		}
	}
}

// literalsIn returns the string literals of f, but not import paths.
func literalsIn(f *ast.File) []*ast.BasicLit {
	var lits []*ast.BasicLit
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ImportSpec:
			return false
		case *ast.BasicLit:
			if n.Kind == token.STRING {
				lits = append(lits, n)
			}
		}
		return true
	})
	return lits
}

// TestLiteralScanFindsEachForm checks the scan above on code that spells
// the words in each place code can: a call argument, a composite literal,
// a comparison, a switch case, a map key, a constant of its own.
func TestLiteralScanFindsEachForm(t *testing.T) {
	t.Parallel()
	words := vocabulary(t)
	tests := []struct {
		name, src string
		want      []string
	}{
		{"call argument", `r.status(name, 0, "Failed", "no longer desired")`, []string{"Failed"}},
		{"composite literal", `_ = &Event{Kind: "Key", Reason: "NotAttachable"}`, []string{"Key", "NotAttachable"}},
		{"comparison", `if e.GetKind() == "Key" || s.GetHealth() != "healthy" {}`, []string{"Key", "healthy"}},
		{"switch case", `switch p { case "Running", "Pulling": }`, []string{"Running", "Pulling"}},
		{"map key", `_ = map[string]string{"PowerCycled": "power-cycle"}`, []string{"PowerCycled"}},
		{"raw string", "_ = `OrphanStopped`", []string{"OrphanStopped"}},
		{"other words pass", `log.Info("Running late", "kind", "Keys", "phase", "failed")`, nil},
		{"constants pass", `_ = edgeboxv1.PhaseFailed`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := "package p\n\nimport _ \"Key\"\n\nfunc f() {\n" + tc.src + "\n}\n"
			f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, lit := range literalsIn(f) {
				if val, _ := strconv.Unquote(lit.Value); words[val] != nil {
					got = append(got, val)
				}
			}
			sort.Strings(got)
			want := append([]string(nil), tc.want...)
			sort.Strings(want)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("found %q, want %q", got, want)
			}
		})
	}
}

// TestKindOfNamesEverySpec checks that each spec of DesiredObject has its
// kind, and that the kinds are the constants above.
func TestKindOfNamesEverySpec(t *testing.T) {
	t.Parallel()
	tests := []struct {
		obj  *DesiredObject
		want string
	}{
		{&DesiredObject{Spec: &DesiredObject_Workload{Workload: &Workload{}}}, KindWorkload},
		{&DesiredObject{Spec: &DesiredObject_UsbAssignment{UsbAssignment: &UsbAssignment{}}}, KindUsbAssignment},
		{&DesiredObject{Spec: &DesiredObject_AgentConfig{AgentConfig: &AgentConfig{}}}, KindAgentConfig},
		{&DesiredObject{Spec: &DesiredObject_AgentRelease{AgentRelease: &AgentRelease{}}}, KindAgentRelease},
		{&DesiredObject{Spec: &DesiredObject_ImagePrefetch{ImagePrefetch: &ImagePrefetch{}}}, KindImagePrefetch},
		{&DesiredObject{Spec: &DesiredObject_SitePeers{SitePeers: &SitePeers{}}}, KindSitePeers},
		{&DesiredObject{Deleted: true, Kind: KindWorkload}, ""},
		{nil, ""},
	}
	oneofs := File_edgebox_v1_desired_proto.Messages().ByName("DesiredObject").Oneofs().ByName("spec").Fields().Len()
	if specs := len(tests) - 2; specs != oneofs {
		t.Fatalf("DesiredObject has %d specs; the table covers %d", oneofs, specs)
	}
	for _, tc := range tests {
		if got := KindOf(tc.obj); got != tc.want {
			t.Errorf("KindOf(%v) = %q, want %q", tc.obj, got, tc.want)
		}
		if tc.want != "" && !ValidKind(tc.want) {
			t.Errorf("kind %q is not a valid kind", tc.want)
		}
	}
}
