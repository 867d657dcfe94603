// Package metrictest reads metrics back from a daemon's own Prometheus
// registry in tests, so a test checks the value an operator's scrape would
// see.
package metrictest

import (
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Gauge returns the value of the gauge name in reg, which must hold it as
// exactly one series (no labels, or one label set); anything else fails
// the test.
func Gauge(t testing.TB, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mf := family(t, reg, name)
	if mf == nil {
		t.Fatalf("metric %s not registered", name)
	}
	if n := len(mf.GetMetric()); n != 1 || mf.GetMetric()[0].GetGauge() == nil {
		t.Fatalf("metric %s: %d series of type %v, want one gauge", name, n, mf.GetType())
	}
	return mf.GetMetric()[0].GetGauge().GetValue()
}

// family is the metric family name in reg, nil when reg holds none.
func family(t testing.TB, reg prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// Series is the value of the first series of the counter or gauge name in
// reg whose labels include labels (every one of them, with its value): 0
// when there is none yet, as a counter not yet incremented reads.
func Series(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
series:
	for _, m := range family(t, reg, name).GetMetric() {
		for k, v := range labels {
			if !slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetName() == k && lp.GetValue() == v }) {
				continue series
			}
		}
		return m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return 0
}

// Samples is the number of observations of the histogram name in reg,
// summed over its series whose labels (name to value; a label a series
// lacks reads "") satisfy match: 0 when there is none yet.
func Samples(t testing.TB, reg prometheus.Gatherer, name string, match func(labels map[string]string) bool) uint64 {
	t.Helper()
	var n uint64
	for _, m := range family(t, reg, name).GetMetric() {
		labels := make(map[string]string, len(m.GetLabel()))
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if match(labels) {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}

// Scrape is the text a Prometheus scrape of url (a daemon's /metrics)
// reads; an error reaching it or reading it fails the test.
func Scrape(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s\n%s", url, resp.Status, body)
	}
	return string(body)
}
