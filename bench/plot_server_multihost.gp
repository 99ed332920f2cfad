# plot_server_multihost.gp — `bench/server_multihost.sh`: median TTFT per turn of conversations
# spread round-robin over several hosts, with the redis tier, without it, on one host, cache off.
# usage: gnuplot -e "csv='bench/out/multihost.csv'; out='docs/img/server_multihost.png'; subtitle='...'" bench/plot_server_multihost.gp
# CSV columns: 1 turn, 2 prompt tokens, 3 cold, 4 redis, 5 local, 6 single, 7 floor (ms)
if (!exists("csv")) csv = 'bench/out/multihost.csv'
if (!exists("out")) out = 'docs/img/server_multihost.png'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 860,520 font ',10'
set output out
set title "kvstash serve: each turn on another host (round robin)\n".subtitle
set style data linespoints
set logscale y
set ylabel 'median TTFT (ms, log scale)'
set xlabel 'turn'
set xtics 1
set grid ytics mytics
set format y '%g'
set key top left box
plot csv using 1:3 title 'cache off (cold prefill)' lc rgb '#d62728' pt 7, \
     '' using 1:5 title 'no redis: local tiers only' lc rgb '#ff7f0e' pt 5, \
     '' using 1:4 title 'redis tier, other host' lc rgb '#1f77b4' pt 9, \
     '' using 1:6 title 'one host (single-host store)' lc rgb '#2ca02c' pt 11, \
     '' using 1:7 title 'floor: new tokens at depth + restore (turn 1: cold)' lc rgb '#7f7f7f' dt 2 pt 1
