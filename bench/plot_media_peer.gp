# plot_media_peer.gp — `bench/media_peer.sh`: time to first token per turn of a
# conversation about one image, kvstash beside llama-server (both --mmproj),
# the last point after both servers were restarted.
# usage: gnuplot -e "csv='bench/out/media_peer_ttft.csv'; out='docs/img/media_peer.png'; turns=6; subtitle='...'" bench/plot_media_peer.gp
# CSV columns: 1 turn (turns+1 = after the restart), 2 kvstash TTFT (ms), 3 llama-server TTFT (ms)
if (!exists("csv")) csv = 'bench/out/media_peer_ttft.csv'
if (!exists("out")) out = 'docs/img/media_peer.png'
if (!exists("turns")) turns = 6
if (!exists("subtitle")) subtitle = ''

set datafile separator ','
set key autotitle columnhead
set terminal pngcairo size 960,600 font ',10'
set output out
set title "time to first token per turn: a conversation about one image (HTTP, streamed)\n".subtitle
set logscale y
set ylabel 'TTFT (ms, log scale)'
set xlabel 'turn (1: the image, nothing cached; the last: the next turn sent to restarted servers)'
set grid ytics mytics xtics
set xtics 1
set xrange [0.7:turns + 1.3]
set xtics add (sprintf("%d\nafter restart", turns + 1) turns + 1)
set format y '%g'
set key top center opaque box
set arrow from turns + 0.5, graph 0 to turns + 0.5, graph 1 nohead dt 2 lc rgb '#888888'
set label 'restart' at turns + 0.55, graph 0.95 tc rgb '#666666'
# turns 1..turns joined by lines; the turn after the restart a point of its own
before(c) = column(1) <= turns ? column(c) : 1/0
after(c) = column(1) > turns ? column(c) : 1/0
plot csv using 1:(before(2)) with linespoints lw 2.5 pt 7 ps 1.2 lc rgb '#1f77b4' title columnhead(2), \
     csv using 1:(before(3)) with linespoints lw 1.5 pt 5 ps 1.2 dt 2 lc rgb '#d62728' title columnhead(3), \
     csv using 1:(after(2)) with points pt 7 ps 1.6 lc rgb '#1f77b4' notitle, \
     csv using 1:(after(3)) with points pt 5 ps 1.6 lc rgb '#d62728' notitle
