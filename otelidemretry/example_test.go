package otelidemretry_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/otelidemretry"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A payment answered 503, then 201: one span with an event per attempt,
// and the metrics, among them the time of the payment's reservation in the
// journal (its write and fdatasync, before the first attempt left). An app
// would give its own providers (or none, for the global ones) and export
// them.
func Example() {
	// A payment server that is busy once.
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer tp.Shutdown(context.Background())
	defer mp.Shutdown(context.Background())

	inst, err := otelidemretry.New(otelidemretry.WithTracerProvider(tp), otelidemretry.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Close()
	dir, err := os.MkdirTemp("", "idemretry-otel-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tr, err := inst.NewTransport(nil, idemretry.WithJournalDir(dir))
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	client := &http.Client{Transport: tr}

	ctx := idemretry.WithAction(context.Background(), "pay:order-1001")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close() // ends the span

	for _, s := range spans.Ended() {
		fmt.Println(s.Name(), s.SpanKind())
		for _, ev := range s.Events() {
			fmt.Print("  ", ev.Name)
			for _, kv := range ev.Attributes {
				if kv.Key != otelidemretry.AttemptDuration {
					fmt.Print(" ", kv.Key, "=", kv.Value.Emit())
				}
			}
			fmt.Println()
		}
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "http.response.status_code", otelidemretry.AttemptsKey, otelidemretry.ReplayedKey:
				fmt.Println("  ", kv.Key, "=", kv.Value.Emit())
			}
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			var n int64
			for _, dp := range d.DataPoints {
				n += dp.Value
			}
			fmt.Println(m.Name, n)
		case metricdata.Histogram[float64]: // their counts; the values are times
			var n uint64
			for _, dp := range d.DataPoints {
				n += dp.Count
			}
			fmt.Println(m.Name, n, "values")
		}
	}
	// Output:
	// idemretry POST client
	//   idemretry.attempt idemretry.attempt=1 http.response.status_code=503
	//   idemretry.attempt idemretry.attempt=2 http.response.status_code=201
	//    idemretry.attempts = 2
	//    http.response.status_code = 201
	//    idemretry.replayed = false
	// idemretry.attempts 2
	// idemretry.retries 1
	// idemretry.done 1
	// idemretry.attempt.duration 2 values
	// idemretry.journal.reserve.duration 1 values
	// idemretry.journal.reserves 1
	// idemretry.journal.syncs 0
}
