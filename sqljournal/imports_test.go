package sqljournal_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// sqljournal is a journal like any third party's: its code reaches
// idemretry's module only through the seam package journal, never through
// the Transport's package (whose internals it must not depend on, and
// which would pull the Transport into every program that only opens a
// table). Tests and examples may use the whole module.
func TestImportsOnlyTheSeam(t *testing.T) {
	const (
		module = "github.com/idemretry/idemretry"
		seam   = module + "/journal"
		own    = module + "/sqljournal"
	)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked, seamUsers := 0, 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatalf("%s: import %s: %v", name, imp.Path.Value, err)
			}
			switch {
			case path == seam:
				seamUsers++
			case path == own || strings.HasPrefix(path, own+"/"):
			case path == module || strings.HasPrefix(path, module+"/"):
				t.Errorf("%s imports %s: sqljournal's code may import only %s of its parent module", fset.Position(imp.Pos()), path, seam)
			}
		}
	}
	if checked == 0 || seamUsers == 0 {
		t.Fatalf("read %d non-test files, %d importing %s: wrong directory?", checked, seamUsers, seam)
	}
}
