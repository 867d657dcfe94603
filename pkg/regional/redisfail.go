package regional

import "errors"

// redisFailure is a Redis failure answered to a caller (observeScript):
// toStatus answers it as rpcerr.RedisFailedStatus, Unavailable with an
// ErrorInfo saying the service answered and its Redis failed. Its message
// is the failure's.
type redisFailure struct{ err error }

func (e *redisFailure) Error() string { return e.err.Error() }
func (e *redisFailure) Unwrap() error { return e.err }

// isRedisFailure reports whether err is (or wraps) a redisFailure.
func isRedisFailure(err error) bool {
	var rf *redisFailure
	return errors.As(err, &rf)
}
