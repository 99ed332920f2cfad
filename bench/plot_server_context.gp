# plot_server_context.gp — `bench/server_context.sh`: TTFT of the same new tokens after N
# cached tokens (with and without --flash-attn) vs a fresh prefill of only those tokens.
# usage: gnuplot -e "csv='bench/out/server_context.csv'; out='docs/img/server_context.png'; subtitle='...'" bench/plot_server_context.gp
# CSV columns: 1 cached, 2 ttft, 3 ttft_fa, 4 floor (depth 0), 5 floor_depth (ms)
if (!exists("csv")) csv = 'bench/out/server_context.csv'
if (!exists("out")) out = 'docs/img/server_context.png'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set terminal pngcairo size 860,520 font ',10'
set output out
set title "kvstash serve: new tokens after N cached tokens vs a fresh prefill of them\n".subtitle
set xlabel 'cached tokens in the slot'
set ylabel 'median TTFT (ms)'
set yrange [0:*]
set grid
set key top left box
plot csv using 1:2 skip 1 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'cache on', \
     csv using 1:3 skip 1 with linespoints lw 2 pt 5 lc rgb '#9467bd' title 'cache on, --flash-attn', \
     csv using 1:5 skip 1 with linespoints lw 2 pt 9 dt 2 lc rgb '#2ca02c' title 'floor: the new tokens at their depth (llama.cpp alone)', \
     csv using 1:($5*1.2) skip 1 with lines dt 3 lw 1 lc rgb '#ff7f0e' title '1.2x floor at depth', \
     csv using 1:4 skip 1 with linespoints lw 1 pt 6 dt 3 lc rgb '#7f7f7f' title 'the new tokens prefilled fresh (depth 0)'
