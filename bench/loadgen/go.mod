module reshape/bench/loadgen

go 1.19
