package rpcerr

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRedisFailedTellsOnlyItsOwnAnswer: RedisFailed is true for the
// answer RedisFailedStatus makes (also wrapped, and once it crossed the
// wire as a status proto), keeping the failure's message, and false for
// an Unavailable without the ErrorInfo (a service that could not be
// reached), for another code carrying it, for another reason or domain,
// and for errors that are no status at all.
func TestRedisFailedTellsOnlyItsOwnAnswer(t *testing.T) {
	cause := errors.New("redis did not answer the check script in time")
	answer := RedisFailedStatus(cause)
	st := status.Convert(answer)
	if st.Code() != codes.Unavailable || st.Message() != cause.Error() {
		t.Fatalf("answer %v: want Unavailable with the cause's message", answer)
	}
	if !RedisFailed(answer) || !RedisFailed(fmt.Errorf("sync: %w", answer)) {
		t.Fatalf("the answer (or it wrapped) not seen as Redis failing")
	}
	// As a client receives it: the status rebuilt from its proto.
	if !RedisFailed(status.ErrorProto(st.Proto())) {
		t.Fatalf("the answer rebuilt from its wire form not seen as Redis failing")
	}
	withInfo := func(c codes.Code, domain, reason string) error {
		s, err := status.New(c, "x").WithDetails(&errdetails.ErrorInfo{Domain: domain, Reason: reason})
		if err != nil {
			t.Fatal(err)
		}
		return s.Err()
	}
	for name, err := range map[string]error{
		"unreachable":    status.Error(codes.Unavailable, "connection refused"),
		"another code":   withInfo(codes.Internal, ErrorDomain, ReasonRedisFailed),
		"another reason": withInfo(codes.Unavailable, ErrorDomain, "OTHER"),
		"another domain": withInfo(codes.Unavailable, "example.com", ReasonRedisFailed),
		"no status":      cause,
		"no error":       nil,
		"other detail type": func() error {
			s, _ := status.New(codes.Unavailable, "x").WithDetails(&errdetails.RetryInfo{})
			return s.Err()
		}(),
	} {
		if RedisFailed(err) {
			t.Errorf("%s (%v) seen as Redis failing", name, err)
		}
	}
}

// TestRedisNodeFailedIsARedisFailureOfOneNode: the answer of a key whose
// Redis Cluster node failed is a Redis failure (the service answered) that
// RedisNodeFailed tells apart, also wrapped and rebuilt from its wire
// form; the answer of a Redis that failed as a whole is not a node's.
func TestRedisNodeFailedIsARedisFailureOfOneNode(t *testing.T) {
	cause := errors.New("redis node 127.0.0.1:7001 does not answer")
	node := RedisNodeFailedStatus(cause)
	wire := status.ErrorProto(status.Convert(node).Proto())
	for name, err := range map[string]error{"answer": node, "wrapped": fmt.Errorf("acquire: %w", node), "from the wire": wire} {
		if !RedisNodeFailed(err) || !RedisFailed(err) {
			t.Errorf("%s: RedisNodeFailed %v, RedisFailed %v; want both", name, RedisNodeFailed(err), RedisFailed(err))
		}
	}
	if st := status.Convert(node); st.Code() != codes.Unavailable || st.Message() != cause.Error() {
		t.Errorf("answer %v: want Unavailable with the cause's message", node)
	}
	if whole := RedisFailedStatus(cause); RedisNodeFailed(whole) {
		t.Errorf("a Redis failed as a whole (%v) seen as one node's failure", whole)
	}
	if RedisNodeFailed(status.Error(codes.Unavailable, "connection refused")) || RedisNodeFailed(nil) {
		t.Error("an unreachable service or no error seen as a node's failure")
	}
}
