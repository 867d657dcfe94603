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
	// ReasonRedisNodeFailed: the service answered; the Redis Cluster node
	// that holds the call's key failed it, and other keys, held by other
	// nodes, may be served. A caller decides that key by its failure
	// policy without judging the region unreachable.
	ReasonRedisNodeFailed = "REDIS_NODE_FAILED"
)

// RedisFailedStatus is the answer to a call whose Redis failed with err:
// Unavailable, err's message, and the ErrorInfo of ReasonRedisFailed.
func RedisFailedStatus(err error) error { return withReason(err, ReasonRedisFailed) }

// RedisNodeFailedStatus is the answer to a call on one key whose Redis
// Cluster node failed with err: Unavailable, err's message, and the
// ErrorInfo of ReasonRedisNodeFailed.
func RedisNodeFailedStatus(err error) error { return withReason(err, ReasonRedisNodeFailed) }

func withReason(err error, reason string) error {
	st := status.New(codes.Unavailable, err.Error())
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: reason}); derr == nil {
		st = d
	}
	return st.Err()
}

// RedisFailed reports whether err is a regional service's answer that its
// Redis failed the call (RedisFailedStatus or RedisNodeFailedStatus): the
// service was reached and answered. An error that wraps such an answer
// counts.
func RedisFailed(err error) bool {
	r := reason(err)
	return r == ReasonRedisFailed || r == ReasonRedisNodeFailed
}

// RedisNodeFailed reports whether err is a regional service's answer that
// the Redis Cluster node of the call's key failed it
// (RedisNodeFailedStatus). An error that wraps such an answer counts.
func RedisNodeFailed(err error) bool { return reason(err) == ReasonRedisNodeFailed }

// reason is the reason of err's ErrorInfo of ErrorDomain when err is an
// Unavailable status carrying one, else "".
func reason(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}
