package regional

import "errors"

// redisFailure is a Redis failure answered to a caller (observeScript):
// toStatus answers it as rpcerr.RedisFailedStatus, Unavailable with an
// ErrorInfo saying the service answered and its Redis failed, or, when
// node names the Redis Cluster master that failed the call's key
// (clusterNodes), as rpcerr.RedisNodeFailedStatus. Its message is the
// failure's.
type redisFailure struct {
	err  error
	node string
}

func (e *redisFailure) Error() string { return e.err.Error() }
func (e *redisFailure) Unwrap() error { return e.err }

// isRedisFailure reports whether err is (or wraps) a redisFailure.
func isRedisFailure(err error) bool {
	var rf *redisFailure
	return errors.As(err, &rf)
}

// isNodeFailure reports whether err is (or wraps) the failure of one Redis
// Cluster master: a nodeFailure, or a redisFailure naming its node.
func isNodeFailure(err error) bool {
	if rf := (*redisFailure)(nil); errors.As(err, &rf) && rf.node != "" {
		return true
	}
	var nf *nodeFailure
	return errors.As(err, &nf)
}
