# plot_server_multiturn.gp — `bench/server_multiturn.sh`: median TTFT per turn over HTTP,
# cache on vs --no-cache-prompt vs the floor (a fresh prefill of only the new tokens).
# usage: gnuplot -e "csv='bench/out/server_multiturn.csv'; out='docs/img/server_multiturn.png'; subtitle='...'" bench/plot_server_multiturn.gp
# CSV columns: 1 turn, 2 prompt, 3 cached, 4 new, 5 ttft_on, 6 ttft_off, 7 floor (depth 0),
#              8 ratio (on/floor), 9 floor_depth, 10 ratio_depth (on/floor_depth)
if (!exists("csv")) csv = 'bench/out/server_multiturn.csv'
if (!exists("out")) out = 'docs/img/server_multiturn.png'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 960,820 font ',10'
set output out
set multiplot layout 2,1 title "kvstash serve: time to first token per turn (HTTP, streamed)\n".subtitle

set size 1,0.56
set origin 0,0.36
set tmargin 1
set logscale y
set ylabel 'TTFT (ms, log scale)'
set grid ytics mytics xtics
set xtics 1
set key top left opaque box
set format y '%g'
plot csv using 1:6 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'cache off (whole history prefilled)', \
     csv using 1:5 with linespoints lw 2 pt 5 lc rgb '#1f77b4' title 'cache on', \
     csv using 1:9 with linespoints lw 2 pt 9 dt 2 lc rgb '#2ca02c' title 'floor: prefill of only the new tokens, at their depth', \
     csv using 1:7 with linespoints lw 1 pt 6 dt 3 lc rgb '#7f7f7f' title 'the same tokens prefilled fresh (depth 0)'

set size 1,0.36
set origin 0,0
set tmargin 1
unset logscale y
set ylabel 'cache on / floor'
set xlabel 'turn'
set yrange [0:*]
set key bottom right opaque box
plot csv using 1:10 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'median TTFT on / floor at depth', \
     csv using 1:8 with linespoints lw 1 pt 6 dt 3 lc rgb '#7f7f7f' title 'median TTFT on / floor at depth 0', \
     1.2 with lines dt 2 lw 2 lc rgb '#ff7f0e' title 'target 1.2x'
unset multiplot
