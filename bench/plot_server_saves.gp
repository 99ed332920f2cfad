# plot_server_saves.gp — `bench/server_saves.sh`: concurrent requests with the store's saves
# on vs no store (median TTFT and batch time per turn).
# usage: gnuplot -e "csv='bench/out/server_saves_summary.csv'; out='docs/img/server_saves.png'; subtitle='...'" bench/plot_server_saves.gp
# CSV columns: 1 turn, 2 ttft_store, 3 ttft_nostore, 4 batch_store, 5 batch_nostore (ms)
if (!exists("csv")) csv = 'bench/out/server_saves_summary.csv'
if (!exists("out")) out = 'docs/img/server_saves.png'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 860,520 font ',10'
set output out
set title "kvstash serve: concurrent requests, store saves on vs no store\n".subtitle
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:*]
set ylabel 'ms'
set grid ytics
set key top right box
plot csv using 2:xtic(1) title 'median TTFT, store' lc rgb '#1f77b4', \
     '' using 3 title 'median TTFT, no store' lc rgb '#aec7e8', \
     '' using 4 title 'median batch time, store' lc rgb '#ff7f0e', \
     '' using 5 title 'median batch time, no store' lc rgb '#ffbb78'
