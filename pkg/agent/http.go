package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// MaxBodyBytes is the largest /v1/allow request body accepted.
const MaxBodyBytes = 64 << 10

// Limiter decides one request on one quota key (*lease.Client).
type Limiter interface {
	Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error)
}

// AllowRequest is the body of POST /v1/allow.
type AllowRequest struct {
	Tenant string `json:"tenant"`
	Class  string `json:"class"`
	// Cost is optional, default 1. On the wire it is any JSON number whose
	// value is a whole number, 1.0 and 1e3 as well as 1 and 1000 (a client
	// may write every number as a float).
	Cost *int64 `json:"cost,omitempty"`
}

// AllowResponse is the answer to a decided POST /v1/allow (see the
// package doc for each field).
type AllowResponse struct {
	Allowed      bool  `json:"allowed"`
	WouldDeny    bool  `json:"would_deny"`
	Limit        int64 `json:"limit"`
	Cap          int64 `json:"cap"`
	Remaining    int64 `json:"remaining"`
	ResetMS      int64 `json:"reset_ms"`
	RetryAfterMS int64 `json:"retry_after_ms"`
	RetryNever   bool  `json:"retry_never"`
	Degraded     bool  `json:"degraded"`
}

// ErrorResponse is the body of every /v1/allow error.
type ErrorResponse struct {
	Error string `json:"error"`
	// Field names the request field at fault, when one is.
	Field string `json:"field,omitempty"`
}

// Outcomes of /v1/allow requests (the outcome label of
// sluice_agent_http_requests_total).
const (
	outcomeOK           = "ok"
	outcomeOverLimit    = "over_limit"
	outcomeShadowDenied = "shadow_denied"
	outcomeInvalid      = "invalid"
	outcomeUnavailable  = "unavailable"
	outcomeAbandoned    = "abandoned"
)

// api serves POST /v1/allow.
type api struct {
	config  ConfigSource
	limiter Limiter // set once before serving

	requests map[string]prometheus.Counter // by outcome; fixed at construction
	duration prometheus.Histogram
}

func newAPI(cfg ConfigSource, reg prometheus.Registerer) (*api, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_agent_http_requests_total",
		Help: "POST /v1/allow requests by outcome (ok, over_limit, shadow_denied, invalid, unavailable, abandoned: the client hung up before the decision).",
	}, []string{"outcome"})
	a := &api{config: cfg, requests: map[string]prometheus.Counter{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_agent_http_request_duration_seconds",
			Help:    "Time to answer one POST /v1/allow, from the request's headers to its answer written.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
		})}
	for _, o := range []string{outcomeOK, outcomeOverLimit, outcomeShadowDenied, outcomeInvalid, outcomeUnavailable, outcomeAbandoned} {
		a.requests[o] = vec.WithLabelValues(o)
	}
	if reg != nil {
		if err := reg.Register(vec); err != nil {
			return nil, fmt.Errorf("agent: registering metrics: %w", err)
		}
		if err := reg.Register(a.duration); err != nil {
			return nil, fmt.Errorf("agent: registering metrics: %w", err)
		}
	}
	return a, nil
}

// badRequest is a refused request: its message and the field at fault.
type badRequest struct {
	status int
	field  string
	msg    string
	// gone: the caller stopped sending the request (counted abandoned, not
	// invalid: nothing in what it sent was wrong).
	gone bool
}

func (e *badRequest) Error() string { return e.msg }

func refuse(field, format string, args ...any) *badRequest {
	return &badRequest{status: http.StatusBadRequest, field: field, msg: fmt.Sprintf(format, args...)}
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	out := a.serve(w, r)
	a.requests[out].Inc()
	a.duration.Observe(time.Since(start).Seconds())
}

func (a *api) serve(w http.ResponseWriter, r *http.Request) string {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &badRequest{status: http.StatusMethodNotAllowed, msg: "method " + r.Method + " is not allowed: POST a JSON body"})
		return outcomeInvalid
	}
	req, berr := decode(w, r)
	if berr != nil {
		writeError(w, berr)
		if berr.gone {
			return outcomeAbandoned
		}
		return outcomeInvalid
	}
	cfg := a.config.Current()
	if cfg == nil {
		writeError(w, &badRequest{status: http.StatusServiceUnavailable, msg: "no config loaded yet"})
		return outcomeUnavailable
	}
	key, cost, res, berr := validate(cfg, req)
	if berr != nil {
		writeError(w, berr)
		return outcomeInvalid
	}
	d, err := a.limiter.Allow(r.Context(), key, cost)
	if err != nil {
		if errors.Is(err, quota.ErrInvalid) {
			writeError(w, refuse("", "tenant %q, class %q: %s", key.Tenant, key.Class, plain(err)))
			return outcomeInvalid
		}
		if errors.Is(err, lease.ErrAbandoned) && r.Context().Err() != nil {
			// The client hung up before the decision: nothing was
			// admitted, no one reads an answer, and the region did not
			// fail (an operator alerting on unavailable must not see it).
			return outcomeAbandoned
		}
		writeError(w, &badRequest{status: http.StatusServiceUnavailable, msg: "deciding: " + err.Error()})
		return outcomeUnavailable
	}
	resp, out := answer(time.Now(), d, res)
	writeJSON(w, http.StatusOK, resp)
	return out
}

// decode reads the body as exactly one JSON object of AllowRequest's
// fields, each named exactly (encoding/json alone would take "TENANT" or
// a name spelled with other letters that fold to the same for "tenant")
// and at most once (it would keep the last of two).
func decode(w http.ResponseWriter, r *http.Request) (AllowRequest, *badRequest) {
	var req AllowRequest
	if r.ContentLength > MaxBodyBytes {
		// Refused on its headers: reading on would wait for a body that
		// may never come (the caller that announced it sent less, or
		// waits for 100 Continue), and nothing it holds could change the
		// answer. The connection closes after the answer, as after a body
		// found oversize: what is left of the body must not be read as the
		// next request, nor drained first.
		w.Header().Set("Connection", "close")
		return req, &badRequest{status: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("body exceeds %d bytes (its Content-Length is %d)", MaxBodyBytes, r.ContentLength)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return req, &badRequest{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("body exceeds %d bytes", MaxBodyBytes)}
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The server's read timeout (Options.RequestReadTimeout).
			return req, &badRequest{status: http.StatusRequestTimeout, msg: "the body did not arrive in full within the agent's read timeout", gone: true}
		case errors.Is(err, io.ErrUnexpectedEOF):
			return req, &badRequest{status: http.StatusBadRequest, msg: "the body ended before the length its Content-Length announced", gone: true}
		}
		return req, refuse("", "reading the body failed")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return req, refuse("", `body is empty: send a JSON object such as {"tenant":"acme","class":"read","cost":1}`)
	}
	// First the syntax, whole: the decoder's token stream below does not
	// place its syntax errors reliably.
	dec := json.NewDecoder(bytes.NewReader(body))
	var value json.RawMessage
	syntaxErr := dec.Decode(&value)
	// Valid JSON up to values nested deeper than encoding/json reads: as
	// every field of a request holds a string or a number, such a value is
	// the body itself or one field's, and the walk below refuses either
	// before it reads the value (only then is the depth the answer).
	_, deep := tooDeep(body, syntaxErr)
	switch {
	case deep:
		value = body
	case syntaxErr != nil:
		return req, jsonError(body, syntaxErr)
	case dec.More():
		return req, refuse("", "body holds more than one JSON value")
	}
	// JSON is UTF-8 (RFC 8259). Outside a string the syntax check above
	// names a byte that is not; inside one encoding/json would turn it
	// into U+FFFD, and the field's check would then name a byte the
	// client never sent.
	if !utf8.Valid(body) {
		at := 0
		for at < len(body) {
			r, n := utf8.DecodeRune(body[at:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			at += n
		}
		return req, refuse("", "body is not UTF-8 (as JSON must be): byte %#02x at offset %d, inside a string", body[at], at)
	}
	// Then the object's fields, one by one.
	dec = json.NewDecoder(bytes.NewReader(value))
	tok, err := dec.Token()
	if err != nil {
		return req, jsonError(value, err)
	}
	if tok != json.Delim('{') {
		return req, refuse("", "body must be a JSON object (got a JSON %s)", jsonKind(tok))
	}
	var seen [3]bool // tenant, class, cost
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return req, jsonError(value, err)
		}
		name, _ := tok.(string) // an object's keys are strings
		var dst any
		var i int
		switch name {
		case "tenant":
			dst, i = &req.Tenant, 0
		case "class":
			dst, i = &req.Class, 1
		case "cost":
			i = 2
		default:
			return req, refuse(name, "unknown field %q (the fields are tenant, class and cost)", name)
		}
		if seen[i] {
			return req, refuse(name, "field %q appears more than once: send each field once", name)
		}
		seen[i] = true
		// An array or an object is no field's value: refused unread, so
		// that however deep it nests, the answer names the field.
		if kind := kindAt(value, dec.InputOffset()); kind == "array" || kind == "object" {
			return req, wrongKind(name, kind)
		}
		if name == "cost" {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return req, fieldError(name, err)
			}
			var berr *badRequest
			if req.Cost, berr = parseCost(bytes.TrimSpace(raw)); berr != nil {
				return req, berr
			}
			continue
		}
		if err := dec.Decode(dst); err != nil {
			return req, fieldError(name, err)
		}
	}
	if deep {
		return req, jsonError(body, syntaxErr)
	}
	return req, nil
}

// parseCost reads the value of the cost field, one JSON value: a number
// whose value is a whole number from 1 to quota.MaxCost, however it is
// written (encoding/json takes neither a fraction nor an exponent into an
// int64, and clients that write every number as a float send 1.0), or null
// for the default. Anything else is refused, quoting the number as sent.
func parseCost(raw []byte) (*int64, *badRequest) {
	switch kind := kindAt(raw, 0); kind {
	case "null":
		return nil, nil
	case "number":
	default:
		return nil, wrongKind("cost", kind)
	}
	n, whole := wholeNumber(string(raw))
	switch {
	case !whole:
		return nil, refuse("cost", "cost must be a whole number of tokens from 1 to %d (got %s)", quota.MaxCost, raw)
	case n < 1:
		return nil, refuse("cost", "cost %s must be at least 1", raw)
	case n > quota.MaxCost:
		return nil, refuse("cost", "cost %s exceeds the maximum %d", raw, quota.MaxCost)
	}
	return &n, nil
}

// wholeNumber reads num, a JSON number, exactly (a float64 would take
// 1.0000000000000000001 for 1): whether its value is a whole number, and
// that number when it is, beyond ±(quota.MaxCost+1) that bound.
func wholeNumber(num string) (int64, bool) {
	neg := strings.HasPrefix(num, "-")
	mantissa, exponent, _ := strings.Cut(strings.TrimPrefix(num, "-"), "e")
	if i := strings.IndexByte(mantissa, 'E'); i >= 0 {
		mantissa, exponent = mantissa[:i], mantissa[i+1:]
	}
	intPart, frac, _ := strings.Cut(mantissa, ".")
	// The value is digits × 10^exp.
	digits := strings.TrimLeft(intPart+frac, "0")
	exp := int64(0)
	if exponent != "" {
		// Out of int64's range ParseInt returns the nearest bound: far
		// beyond any cost either way.
		exp, _ = strconv.ParseInt(exponent, 10, 64)
	}
	exp = min(max(exp, -1<<32), 1<<32) - int64(len(frac))
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	digits = trimmed
	const bound = quota.MaxCost + 1
	var n int64
	switch {
	case digits == "":
		return 0, true
	case exp < 0: // its last digit, not 0, is a fraction's
		return 0, false
	case int64(len(digits))+exp > int64(len(strconv.Itoa(bound))):
		n = bound
	default:
		n, _ = strconv.ParseInt(digits+strings.Repeat("0", int(exp)), 10, 64)
		n = min(n, bound)
	}
	if neg {
		n = -n
	}
	return n, true
}

// kindAt names the kind of the JSON value after the object key that ends
// at offset off of data.
func kindAt(data []byte, off int64) string {
	for ; off < int64(len(data)); off++ {
		switch data[off] {
		case ' ', '\t', '\n', '\r', ':':
			continue
		case '[':
			return "array"
		case '{':
			return "object"
		case '"':
			return "string"
		case 't', 'f':
			return "bool"
		case 'n':
			return "null"
		}
		return "number"
	}
	return ""
}

// maxJSONDepth is how deep encoding/json reads arrays and objects nested
// in one another; it refuses a value nested deeper as a syntax error.
const maxJSONDepth = 10000

// tooDeep reports whether err is encoding/json's refusal of data for
// nesting deeper than maxJSONDepth, and the offset of the byte that went
// one level too deep. data is valid JSON up to that byte.
func tooDeep(data []byte, err error) (int64, bool) {
	var syntaxErr *json.SyntaxError
	if !errors.As(err, &syntaxErr) || syntaxErr.Offset < 1 || syntaxErr.Offset > int64(len(data)) {
		return 0, false
	}
	at := syntaxErr.Offset - 1 // Offset counts the bytes read, the one at fault included
	depth, inString, escaped := 0, false, false
	for _, c := range data[:at+1] {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
		}
	}
	return at, depth > maxJSONDepth
}

// jsonKind names the kind of JSON value tok starts.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "array" // an object is the one wanted
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}

// jsonError says where body, which is not valid JSON, goes wrong, or that
// it nests deeper than encoding/json reads.
func jsonError(body []byte, err error) *badRequest {
	var syntaxErr *json.SyntaxError
	if at, deep := tooDeep(body, err); deep {
		return refuse("", "body nests arrays and objects deeper than %d levels, the most the agent reads (at offset %d)", maxJSONDepth, at)
	}
	switch {
	// Offset counts the bytes read, the one at fault included.
	case errors.As(err, &syntaxErr) && syntaxErr.Offset >= 1 && syntaxErr.Offset <= int64(len(body)):
		return refuse("", "body is not valid JSON: unexpected byte %s", quota.ByteAt(string(body), int(syntaxErr.Offset-1)))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return refuse("", "body is not valid JSON: it ends after %d bytes, before its value does", len(body))
	}
	return refuse("", "body is not valid JSON")
}

// fieldError names the field whose value does not decode.
func fieldError(field string, err error) *badRequest {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return wrongKind(field, typeErr.Value)
	}
	return refuse(field, "%s: %v", field, err)
}

// wrongKind refuses field for holding a JSON value of the kind given.
func wrongKind(field, kind string) *badRequest {
	if field == "cost" {
		return refuse("cost", "cost must be a whole number of tokens from 1 to %d (got a JSON %s)", quota.MaxCost, kind)
	}
	return refuse(field, "%s must be a JSON string (got a JSON %s)", field, kind)
}

// validate checks the request against cfg, naming the field at fault.
func validate(cfg *config.Config, req AllowRequest) (quota.Key, int64, config.Resolved, *badRequest) {
	key := quota.Key{Tenant: req.Tenant, Class: req.Class}
	var res config.Resolved
	if err := quota.ValidateID("tenant", key.Tenant); err != nil {
		return key, 0, res, refuse("tenant", "%s", plain(err))
	}
	if err := key.Validate(); err != nil {
		return key, 0, res, refuse("class", "%s", plain(err))
	}
	cost := int64(1)
	if req.Cost != nil {
		cost = *req.Cost
	}
	if err := quota.ValidateCost(cost); err != nil {
		return key, 0, res, refuse("cost", "%s", plain(err))
	}
	res, err := cfg.Resolve(key)
	if err != nil {
		return key, 0, res, refuse("class", "%s", plain(err))
	}
	// The limiter would deny it forever: refuse it as the Envoy endpoint
	// does.
	if cost > res.Limit.Burst {
		return key, 0, res, refuse("cost", "cost %d exceeds the burst %d of tenant %q, class %q, so it can never be admitted",
			cost, res.Limit.Burst, key.Tenant, key.Class)
	}
	return key, cost, res, nil
}

// plain drops the "invalid argument: " prefix quota.ErrInvalid adds: the
// status already says it.
func plain(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, quota.ErrInvalid.Error()+": "); ok {
		return rest
	}
	return msg
}

// answer turns a Decision into the response; a key in shadow mode (by the
// config) is never refused, whatever produced the decision.
func answer(now time.Time, d quota.Decision, res config.Resolved) (AllowResponse, string) {
	limit := res.Limit.Burst
	capacity := limit
	if d.CapKnown {
		capacity = min(max(d.Cap, 0), limit)
	}
	allowed := d.Allowed || res.Shadow
	resp := AllowResponse{
		Allowed:    allowed,
		WouldDeny:  d.WouldDeny || !d.Allowed,
		Limit:      limit,
		Cap:        capacity,
		Remaining:  min(max(d.Remaining, 0), capacity),
		RetryNever: !allowed && d.RetryNever,
		Degraded:   d.Degraded,
	}
	resp.ResetMS = ceilMS(d.ResetIn(now))
	switch {
	case resp.RetryNever:
		resp.ResetMS = 0
	case !allowed:
		resp.RetryAfterMS = max(ceilMS(d.RetryAfter), 1)
		resp.ResetMS = max(resp.ResetMS, resp.RetryAfterMS)
	}
	switch {
	case !resp.Allowed:
		return resp, outcomeOverLimit
	case resp.WouldDeny:
		return resp, outcomeShadowDenied
	}
	return resp, outcomeOK
}

// ceilMS rounds d up to whole milliseconds (0 for d <= 0).
func ceilMS(d time.Duration) int64 { return quota.WholeUnits(d, time.Millisecond) }

func writeError(w http.ResponseWriter, e *badRequest) {
	writeJSON(w, e.status, ErrorResponse{Error: e.msg, Field: e.field})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // the response types always marshal
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
