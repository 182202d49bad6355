package occ

import (
	"bytes"
	"strings"
	"testing"
)

func TestCSVRoundTrip(t *testing.T) {
	cells := []Cell{
		{Strategy: "None", Clients: 20, Runs: 400, Calls: 101.2345, Time: 777.77},
		{Strategy: "Decorr", Clients: 20, Runs: 400, Calls: 55.5, Time: 888.8},
		{Strategy: "FullJitter", Clients: 10, Runs: 4000, Calls: 39.0, Time: 464.54},
	}
	var buf bytes.Buffer
	if err := WriteCSV(&buf, cells); err != nil {
		t.Fatal(err)
	}
	want := "clients,time,calls,Algorithm,runs\n" +
		"10,464.5,39.00,FullJitter,4000\n" +
		"20,888.8,55.50,Decorr,400\n" +
		"20,777.8,101.23,None,400\n"
	if buf.String() != want {
		t.Fatalf("CSV:\n%s\nwant:\n%s", buf.String(), want)
	}
	back, err := ReadCSV(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := Find(back, "None", 20); !ok || c.Calls != 101.23 || c.Runs != 400 {
		t.Fatalf("read back %+v, %v", c, ok)
	}
}

func TestReadCSVRejectsOtherFormats(t *testing.T) {
	if _, err := ReadCSV(strings.NewReader("clients,time,calls,Algorithm\n10,1,2,None\n")); err == nil {
		t.Fatal("accepted a CSV without the runs column")
	}
	if _, err := ReadCSV(strings.NewReader("clients,time,calls,Algorithm,runs\nten,1,2,None,600\n")); err == nil {
		t.Fatal("accepted a non-numeric client count")
	}
}

func TestCompareFlagsCellsOutsideTolerance(t *testing.T) {
	ref := []Cell{{Strategy: "None", Clients: 10, Calls: 100, Time: 1000}}
	ok := Compare([]Cell{{Strategy: "None", Clients: 10, Calls: 102.9, Time: 951}}, ref)
	if len(ok) != 1 || !ok[0].CallsOK() || !ok[0].TimeOK() {
		t.Fatalf("within tolerance flagged: %+v", ok)
	}
	bad := Compare([]Cell{{Strategy: "None", Clients: 10, Calls: 96.9, Time: 1051}}, ref)
	if bad[0].CallsOK() || bad[0].TimeOK() {
		t.Fatalf("outside tolerance passed: %+v", bad)
	}
}
