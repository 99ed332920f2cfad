# plot_server_turns.gp — median TTFT per turn of several cache-on servers, the cache-off
# server and the ideal floor (a fresh prefill of only the tokens the conversation added).
# Used by bench/server_subagents.sh, server_sharedsys.sh and server_workingset.sh.
# usage: gnuplot -e "csv='bench/out/server_subagents.csv'; out='docs/img/server_subagents.png'; ncol=6; ttl='...'; subtitle='...'" bench/plot_server_turns.gp
# CSV columns: 1 turn, 2 off, 3 floor_ideal (depth 0), 4..ncol one per cache-on server (header =
#              its name), ncol+1 floor_ideal_depth (the same tokens at their depth)
if (!exists("csv")) csv = 'bench/out/server_subagents.csv'
if (!exists("out")) out = 'docs/img/server_subagents.png'
if (!exists("ncol")) ncol = 4
if (!exists("ttl")) ttl = 'kvstash serve: time to first token per turn'
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 960,600 font ',10'
set output out
set title ttl."\n".subtitle
set logscale y
set ylabel 'median TTFT (ms, log scale)'
set xlabel 'turn'
set grid ytics mytics xtics
set xtics 1
set format y '%g'
set key outside right top box
colors = '#1f77b4 #9467bd #ff7f0e #17becf #8c564b #e377c2'
plot csv using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'cache off', \
     for [i=4:ncol] csv using 1:i with linespoints lw 2 pt (i+1) lc rgb word(colors, i-3) title columnhead(i), \
     csv using 1:(column(ncol+1)) with linespoints lw 2 pt 9 dt 2 lc rgb '#2ca02c' title 'floor: only the new tokens, at their depth', \
     csv using 1:3 with linespoints lw 1 pt 6 dt 3 lc rgb '#7f7f7f' title 'the same tokens at depth 0'
