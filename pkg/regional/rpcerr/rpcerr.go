package rpcerr

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The domain and reasons of a regional service's ErrorInfo.
const (
	ErrorDomain = "sluice.regional"
	// ReasonRedisFailed: the service answered; its Redis failed the call
	// (an error, or no answer within the service's own bound).
	ReasonRedisFailed = "REDIS_FAILED"
)

// RedisFailedStatus is the answer to a call whose Redis failed with err:
// Unavailable, err's message, and the ErrorInfo of ReasonRedisFailed.
func RedisFailedStatus(err error) error {
	st := status.New(codes.Unavailable, err.Error())
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonRedisFailed}); derr == nil {
		st = d
	}
	return st.Err()
}

// RedisFailed reports whether err is a regional service's answer that its
// Redis failed the call (RedisFailedStatus): the service was reached and
// answered. An error that wraps such an answer counts.
func RedisFailed(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == ReasonRedisFailed {
			return true
		}
	}
	return false
}
