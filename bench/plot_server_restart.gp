# plot_server_restart.gp — `bench/server_restart.sh`: the first turn after a restart vs its
# floor and vs a cache-off server prefilling the whole history (medians).
# usage: gnuplot -e "csv='bench/out/server_restart_summary.csv'; out='docs/img/server_restart.png'; subtitle='...'" bench/plot_server_restart.gp
# CSV columns: 1 variant, 2 after_restart, 3 floor (depth 0), 4 full_prefill, 5 floor_depth (ms)
if (!exists("csv")) csv = 'bench/out/server_restart_summary.csv'
if (!exists("out")) out = 'docs/img/server_restart.png'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 860,520 font ',10'
set output out
set title "kvstash serve: next turn of a 2000-token conversation after a restart\n".subtitle
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y
set yrange [10:*]
set ylabel 'median TTFT (ms, log scale)'
set grid ytics mytics
set format y '%g'
set key top left box
plot csv using 2:xtic(1) title 'restarted server (store)' lc rgb '#1f77b4', \
     '' using 5 title 'floor: new tokens at their depth + state set' lc rgb '#2ca02c', \
     '' using 3 title 'the new tokens prefilled fresh (depth 0)' lc rgb '#bcbd22', \
     '' using 4 title 'cache off: whole history prefilled' lc rgb '#d62728'
