package bench

// ifZero sets *v to d when *v is the zero value (a negative number keeps
// its meaning, e.g. "none").
func ifZero[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// ifNotPositive sets *v to d when *v is zero or negative.
func ifNotPositive[T ~int | ~int64 | ~float64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
