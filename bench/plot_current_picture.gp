# plot_current_picture.gp — docs/BENCHMARKS.md "The current picture": kvstash's
# time against llama-server's (same pinned llama.cpp, its defaults) for each
# figure of the table that has a llama-server side; below 1 kvstash is faster.
# The numbers are copied from the dated sections (bench/current_picture.csv).
# usage: gnuplot bench/plot_current_picture.gp
if (!exists("csv")) csv = 'bench/current_picture.csv'
if (!exists("out")) out = 'docs/img/current_picture.png'

set datafile separator ','
set terminal pngcairo size 1000,540 font ',10' noenhanced
set output out
set title "kvstash's time / llama-server's (TTFT; decode: time per token), medians of side-by-side runs\nbelow 1: kvstash is faster (docs/BENCHMARKS.md, The current picture)"
set style fill solid 0.8 border -1
set boxwidth 0.6
set yrange [0:1.25]
set ytics 0.1
set grid ytics
set xtics rotate by -25 left nomirror
set ylabel 'kvstash / llama-server'
set key off
set bmargin 8
set rmargin 14
plot csv using 0:2:xtic(1) skip 1 with boxes lc rgb '#1f77b4', \
     '' using 0:2:(sprintf('%.2f×', $2)) skip 1 with labels offset 0,0.7, \
     1 with lines lw 2 dt 2 lc rgb '#d62728'
