package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestRetryNeverOnlyWhereNoWaitHelps: the agent's HTTP API and its Envoy
// endpoint answer retry_never (the never form: OVER_LIMIT with no
// duration_until_reset, retry-after or x-ratelimit-reset) only where no
// wait can cure the denial while the config stays as it is, and a time to
// retry everywhere else, on a lease and a strict class alike:
//   - a region with no global tier (unleased): its cap of 2 is its static
//     share for good, so a cost of 4 (within the burst of 5) is never;
//   - a region with a global tier (not reached here: on its floor, which
//     partition_share 1 makes its whole static share): the global tier
//     grants it more of the burst, so a cost of 4 waits;
//   - the same on its floor with partition_share 0 (its static lease
//     lapsed): its rate is 0 until the global tier answers it, so one token
//     waits.
//
// A cost above the configured burst is a 400 on the HTTP API and the never
// form on the Envoy endpoint, whatever the region. (A real regional
// server and Redis.)
func TestRetryNeverOnlyWhereNoWaitHelps(t *testing.T) {
	for _, tc := range []struct {
		region    string
		share     string
		unleased  bool
		cost      int64
		wantNever bool
	}{
		{region: "unleased", share: "1", unleased: true, cost: 4, wantNever: true},
		{region: "leased", share: "1", cost: 4},
		{region: "floor", share: "0", cost: 1},
	} {
		t.Run(tc.region, func(t *testing.T) {
			cfg := regiontest.MustConfig(t, regiontest.TwoRegionsConfig(tc.share, 5))
			r := regiontest.Start(t, cfg, "local", func(o *regional.Options) {
				o.Registerer, o.Unleased = prometheus.NewRegistry(), tc.unleased
			})
			a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
			web, envoy := httpClient(t), rls(t, a)
			refreshMS := time.Duration(cfg.Refresh).Milliseconds()
			for _, class := range []string{"read", "export"} {
				body := fmt.Sprintf(`{"tenant":"acme","class":%q,"cost":%d}`, class, tc.cost)
				for i := range 3 { // the first answer, then the lease path's memory of it
					out := allow(t, web, a, body)
					if out.Allowed {
						t.Fatalf("%s, request %d, cost %d: %+v, want denied", class, i+1, tc.cost, out)
					}
					if tc.wantNever {
						if !out.RetryNever || out.RetryAfterMS != 0 || out.ResetMS != 0 {
							t.Fatalf("%s, request %d, cost %d: %+v, want retry_never and no time", class, i+1, tc.cost, out)
						}
					} else if out.RetryNever || out.RetryAfterMS < 1 || out.RetryAfterMS > refreshMS {
						t.Fatalf("%s, request %d, cost %d: %+v, want retry_after_ms of at most the refresh (%d ms), no retry_never", class, i+1, tc.cost, out, refreshMS)
					}
				}

				resp, err := envoy.ShouldRateLimit(context.Background(), envoyRequest("sluice", uint32(tc.cost), "tenant", "acme", "class", class))
				if err != nil {
					t.Fatal(err)
				}
				st := resp.GetStatuses()[0]
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Fatalf("%s, Envoy, cost %d: %v, want OVER_LIMIT", class, tc.cost, resp)
				}
				if tc.wantNever != (st.GetDurationUntilReset() == nil) || tc.wantNever != !hasHeader(resp, envoyrls.HeaderRetryAfter) {
					t.Fatalf("%s, Envoy, cost %d: %v; want the never form %v", class, tc.cost, resp, tc.wantNever)
				}

				above := fmt.Sprintf(`{"tenant":"acme","class":%q,"cost":6}`, class)
				if code, data := post(t, web, a, above); code != http.StatusBadRequest {
					t.Fatalf("%s, cost 6 against a burst of 5: %d %s, want 400", class, code, data)
				}
				resp, err = envoy.ShouldRateLimit(context.Background(), envoyRequest("sluice", 6, "tenant", "acme", "class", class))
				if err != nil {
					t.Fatal(err)
				}
				if st := resp.GetStatuses()[0]; resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset() != nil || hasHeader(resp, envoyrls.HeaderRetryAfter) {
					t.Fatalf("%s, Envoy, cost 6 against a burst of 5: %v, want the never form", class, resp)
				}
			}
		})
	}
}

func hasHeader(resp *rlsv3.RateLimitResponse, name string) bool {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == name {
			return true
		}
	}
	return false
}
