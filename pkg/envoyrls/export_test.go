package envoyrls

import "time"

// SetClock fixes the clock s decides with: two Services given the same
// decisions at the same clock answer alike.
func SetClock(s *Service, now func() time.Time) { s.now = now }
