package regionsync

import (
	"fmt"
	"math"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// MaxWireMillis keeps millisecond fields convertible to time.Duration.
const MaxWireMillis = math.MaxInt64 / int64(time.Millisecond)

// DecodeReport checks every field of req against cfg and converts it for
// the allocator, returning each key's limit alongside. At most maxKeys
// keys are accepted: the bound of one message (a report split into pages
// is decoded page by page with CheckReportHeader and DecodeKeys). It
// changes nothing; errors wrap quota.ErrInvalid. A key named twice is the
// allocator's to refuse (hierarchy.Allocator.CheckReportKeys, before the
// report changes anything): it finds one without a map of the report's
// keys, which here cost the global leader about a sixth of its epoch
// (BENCHMARKS.md, "The daemon's per-key maps").
func DecodeReport(cfg *config.Config, req *sluicev1.RegionReport, maxKeys int) (hierarchy.Report, []hierarchy.KeyLimit, error) {
	if err := CheckReportHeader(cfg, req); err != nil {
		return hierarchy.Report{}, nil, err
	}
	keys := req.GetKeys()
	if len(keys) > maxKeys {
		return hierarchy.Report{}, nil, fmt.Errorf("%w: keys has %d entries, the limit is %d", quota.ErrInvalid, len(keys), maxKeys)
	}
	kds, limits, err := DecodeKeys(cfg, keys, 0)
	if err != nil {
		return hierarchy.Report{}, nil, err
	}
	return hierarchy.Report{Region: req.GetRegion(), Seq: req.GetSeq(), Keys: kds}, limits, nil
}

// CheckReportHeader checks the fields of req other than its keys and its
// paging: the region (configured in cfg) and the config revisions. Errors
// wrap quota.ErrInvalid.
func CheckReportHeader(cfg *config.Config, req *sluicev1.RegionReport) error {
	region := req.GetRegion()
	if err := quota.ValidateID("region", region); err != nil {
		return err
	}
	if _, ok := cfg.Regions[region]; !ok {
		return fmt.Errorf("%w: region %q is not configured", quota.ErrInvalid, region)
	}
	if revs := req.GetConfigRevisions(); len(revs) > MaxConfigs {
		return fmt.Errorf("%w: config_revisions has %d entries, the limit is %d", quota.ErrInvalid, len(revs), MaxConfigs)
	}
	for i, rev := range req.GetConfigRevisions() {
		if rev < 0 {
			return fmt.Errorf("%w: config_revisions[%d] %d is negative", quota.ErrInvalid, i, rev)
		}
	}
	return nil
}

// KeyLimit is a resolved key's limit for the allocator: its rate, burst,
// unit and floor share (the class's partition share), as a report's keys
// are decoded and as the global daemon sets the limits of the keys it
// holds when the config changes.
func KeyLimit(res config.Resolved) hierarchy.KeyLimit {
	return hierarchy.KeyLimit{
		Rate: res.Limit.Rate, Burst: float64(res.Limit.Burst), Unit: res.Class.Unit(),
		FloorShare: res.Class.PartitionFraction(),
	}
}

// DecodeKeys checks keys against cfg and converts them for the allocator,
// with each key's limit. keys[i] is named keys[first+i] in errors (its
// place in the whole report when keys is one page of it). As DecodeReport,
// it leaves a key named twice to the allocator. Errors wrap
// quota.ErrInvalid.
func DecodeKeys(cfg *config.Config, keys []*sluicev1.KeyDemand, first int) ([]hierarchy.KeyDemand, []hierarchy.KeyLimit, error) {
	kds := make([]hierarchy.KeyDemand, len(keys))
	limits := make([]hierarchy.KeyLimit, len(keys))
	for i, kd := range keys {
		var err error
		kds[i], limits[i], err = decodeKey(cfg, kd, first+i)
		if err != nil {
			return nil, nil, err
		}
	}
	return kds, limits, nil
}

// decodeKey is DecodeReport for keys[i]; the field's name is only built
// for an error.
func decodeKey(cfg *config.Config, kd *sluicev1.KeyDemand, i int) (hierarchy.KeyDemand, hierarchy.KeyLimit, error) {
	field := func() string { return fmt.Sprintf("keys[%d]", i) }
	fail := func(err error) (hierarchy.KeyDemand, hierarchy.KeyLimit, error) {
		return hierarchy.KeyDemand{}, hierarchy.KeyLimit{}, err
	}
	if kd.GetKey() == nil {
		return fail(fmt.Errorf("%w: %s.key is missing", quota.ErrInvalid, field()))
	}
	k := quota.Key{Tenant: kd.GetKey().GetTenant(), Class: kd.GetKey().GetClass()}
	// Resolve validates k first; a refusal is told apart afterwards, so a
	// valid key is checked once.
	res, err := cfg.Resolve(k)
	if err != nil {
		if verr := k.Validate(); verr != nil {
			return fail(fmt.Errorf("%s.key: %w", field(), verr))
		}
		return fail(fmt.Errorf("%s.key %s: %w", field(), k, err))
	}
	l := KeyLimit(res)
	if !finite(l.Rate) || l.Rate <= 0 || l.Burst <= 0 {
		return fail(fmt.Errorf("%w: %s.key %s: the config gives it rate %v and burst %v; both must be > 0",
			quota.ErrInvalid, field(), k, l.Rate, l.Burst))
	}
	if err := checkCount(field, ".admitted", kd.GetAdmitted()); err != nil {
		return fail(err)
	}
	if err := checkCount(field, ".denied", kd.GetDenied()); err != nil {
		return fail(err)
	}
	if w := kd.GetWindowMs(); w <= 0 || w > MaxWireMillis {
		return fail(fmt.Errorf("%w: %s.window_ms %d must be in 1..%d", quota.ErrInvalid, field(), w, MaxWireMillis))
	}
	if err := checkAmount(field, ".held_rate", kd.GetHeldRate()); err != nil {
		return fail(err)
	}
	if err := checkAmount(field, ".held_burst", kd.GetHeldBurst()); err != nil {
		return fail(err)
	}
	if v := kd.GetHeldValidMs(); v < 0 || v > MaxWireMillis {
		return fail(fmt.Errorf("%w: %s.held_valid_ms %d must be in 0..%d", quota.ErrInvalid, field(), v, MaxWireMillis))
	}
	if err := checkAmount(field, ".holding", kd.GetHolding()); err != nil {
		return fail(err)
	}
	if err := checkAmount(field, ".released", kd.GetReleased()); err != nil {
		return fail(err)
	}
	if kd.DemandRate != nil {
		if err := checkAmount(field, ".demand_rate", kd.GetDemandRate()); err != nil {
			return fail(err)
		}
	}
	out := hierarchy.KeyDemand{
		Key:       k,
		Admitted:  float64(kd.GetAdmitted()),
		Denied:    float64(kd.GetDenied()),
		Window:    time.Duration(kd.GetWindowMs()) * time.Millisecond,
		HeldRate:  kd.GetHeldRate(),
		HeldBurst: kd.GetHeldBurst(),
		HeldValid: time.Duration(kd.GetHeldValidMs()) * time.Millisecond,
		Holding:   kd.GetHolding(),
		Released:  kd.GetReleased(),
	}
	if kd.DemandRate != nil {
		out.SetDemandRate(kd.GetDemandRate())
	}
	return out, l, nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func checkCount(field func() string, name string, v int64) error {
	if v < 0 {
		return fmt.Errorf("%w: %s %d must be >= 0", quota.ErrInvalid, field()+name, v)
	}
	return nil
}

func checkAmount(field func() string, name string, v float64) error {
	if !finite(v) || v < 0 {
		return fmt.Errorf("%w: %s %v must be a finite number >= 0", quota.ErrInvalid, field()+name, v)
	}
	return nil
}

// EncodeGrants is the answer to rep: its grants (validity in whole
// milliseconds, as the allocator computes them), whether the allocator is
// learning, its epoch, and when the region should report again (0: at its
// next epoch).
func EncodeGrants(rep hierarchy.Report, grants []hierarchy.Grant, learning bool, epoch uint64, again time.Duration) *sluicev1.RegionGrants {
	out := &sluicev1.RegionGrants{
		Region:        rep.Region,
		Seq:           rep.Seq,
		Grants:        make([]*sluicev1.KeyGrant, len(grants)),
		Learning:      learning,
		Epoch:         epoch,
		ReportAgainMs: again.Milliseconds(),
	}
	// Two allocations for every grant instead of two per grant: an answer
	// carries a grant for each contended key the region reports.
	kgs, keys := make([]sluicev1.KeyGrant, len(grants)), make([]sluicev1.QuotaKey, len(grants))
	for i, g := range grants {
		keys[i].Tenant, keys[i].Class = g.Key.Tenant, g.Key.Class
		kg := &kgs[i]
		kg.Key, kg.Rate, kg.Burst, kg.ValidMs, kg.Deposit = &keys[i], g.Rate, g.Burst, g.Valid.Milliseconds(), g.Deposit
		out.Grants[i] = kg
	}
	return out
}

// DefaultMaxKeys bounds the keys of one region report message (a whole
// report, or one page of a report split into pages) unless the global
// tier is configured otherwise. A report has no bound on its keys; the
// global tier bounds the bytes of the pages it holds for one region.
const DefaultMaxKeys = 100000
