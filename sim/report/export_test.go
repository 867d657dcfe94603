package report

// The chart colours, for tests that find a line in a chart.
const (
	ColorAdmitted = colAdmitted
	ColorIdeal    = colIdeal
)
